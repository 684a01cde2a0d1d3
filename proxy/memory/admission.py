"""Recall admission: how many recalls work at once, who goes next, how long one waits.

Why a gate in front of the store: a recall costs CPU (the query embedding, full-text
search, the vector scan), and two cores serve only so many at once. Past that, every
recall in flight slows every other one, so under load they all passed their budget
together and memory went off for everyone (issue 16: 16 clients lost a fifth of their
recalls, 64 clients three quarters). With the gate, at most `capacity` recalls are in
the store; the others wait here, in a queue per tenant served round-robin (a tenant
flooding the proxy never pushes a quiet tenant back more than one turn), and the recall
budget starts when a recall is admitted, so it bounds the work, not the queue.

The wait itself is bounded (`max_wait`): a recall that cannot be admitted in time is
given up (the request goes on without memories and says so), having cost nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class AdmissionTimeout(Exception):
    """The recall waited `max_wait` seconds without being admitted."""

    def __init__(self, waited: float) -> None:
        super().__init__(f"not admitted after {waited * 1000:.0f} ms")
        self.waited = waited


class RecallGate:
    """At most `capacity` recalls at once; waiting ones admitted round-robin by tenant."""

    def __init__(self, capacity: int, max_wait: float) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.max_wait = max_wait
        self.running = 0
        self._running_by: dict[str, int] = {}  # recalls working, per tenant
        # tenant -> its waiters, oldest first; the dict's order is the round-robin turn.
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    async def run(self, tenant: str, work: Callable[[], Awaitable[T]]) -> tuple[T, float]:
        """`await work()` once admitted; returns its result and the seconds waited.

        Raises AdmissionTimeout when not admitted within `max_wait`.
        """
        started = time.monotonic()
        if self.running < self.capacity and not self._waiting:
            self.running += 1
        else:
            await self._wait(tenant, started)
        waited = time.monotonic() - started
        self._running_by[tenant] = self._running_by.get(tenant, 0) + 1
        try:
            return await work(), waited
        finally:
            left = self._running_by[tenant] - 1
            if left:
                self._running_by[tenant] = left
            else:
                del self._running_by[tenant]
            self._release()

    async def _wait(self, tenant: str, started: float) -> None:
        admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(admitted)
        try:
            await asyncio.wait_for(asyncio.shield(admitted), self.max_wait)
        except BaseException as exc:
            if admitted.done() and not admitted.cancelled():
                self._release()  # admitted just as the wait ended: the slot goes on
            else:
                admitted.cancel()
                self._forget(tenant, admitted)
            if isinstance(exc, TimeoutError):
                raise AdmissionTimeout(time.monotonic() - started) from None
            raise

    def _forget(self, tenant: str, admitted: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is None:
            return
        try:
            queue.remove(admitted)
        except ValueError:
            pass
        if not queue:
            del self._waiting[tenant]

    def _release(self) -> None:
        """A slot came free: give it to the waiting tenant with the fewest recalls working
        (the first in turn among equals), else count it free."""
        while self._waiting:
            tenant = min(self._waiting, key=lambda t: self._running_by.get(t, 0))
            queue = self._waiting[tenant]
            admitted = queue.popleft()
            if queue:
                self._waiting.move_to_end(tenant)  # its next waiter goes after the others
            else:
                del self._waiting[tenant]
            if not admitted.done():
                admitted.set_result(None)  # the slot passes on; `running` is unchanged
                return
        self.running -= 1
