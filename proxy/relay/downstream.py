"""The client side of a proxied request: its body, and noticing when it goes away.

A handler that needs the whole body first (chat completions) reads it straight from
`receive()` (`read_body`): no task and no stream between the socket and the handler, so
nothing waits an event-loop turn per chunk. A handler that streams the body on (pass
through) gets it from a pump task through a small bounded stream (back-pressure for
large uploads). Either way, once the body is complete a pump task keeps listening, so
that an `http.disconnect` cancels the handler, and with it the upstream request, at
once: while the body arrives, before the first byte, mid-stream, or for a plain JSON
answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from proxy.relay.asgi import Receive

log = logging.getLogger("memrelay.relay")


class BodyTooLarge(Exception):
    """The request body exceeded the configured limit."""


class Downstream:
    """Body chunks and disconnect state of one request."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._handler: asyncio.Task[object] | None = None  # the task running `run`
        self._pump_task: asyncio.Task[None] | None = None
        self._body_send: MemoryObjectSendStream[bytes] | None = None
        self._body_recv: MemoryObjectReceiveStream[bytes] | None = None
        self.disconnected = False

    def _start_pump(self, body: bool) -> None:
        """The pump: body chunks into the stream (if `body`), then the watch for a disconnect."""
        assert self._handler is not None, "Downstream.run is not running"
        if body:
            send, recv = anyio.create_memory_object_stream[bytes](4)
            self._body_send, self._body_recv = send, recv
        self._pump_task = asyncio.get_running_loop().create_task(self._pump(body))
        self._pump_task.add_done_callback(_retrieve)

    def _gone(self) -> None:
        """The client went away: cancel the handler (and with it the upstream request)."""
        if not self.disconnected and self._handler is not None:
            self.disconnected = True
            self._handler.cancel()

    async def _pump(self, body_open: bool) -> None:
        try:
            while True:
                message = await self._receive()
                kind = message.get("type")
                if kind == "http.request" and body_open:
                    assert self._body_send is not None
                    chunk = message.get("body", b"")
                    if chunk:
                        await self._body_send.send(chunk)
                    if not message.get("more_body", False):
                        body_open = False
                        self._body_send.close()
                elif kind == "http.disconnect":
                    self._gone()
                    return
        finally:
            if self._body_send is not None:
                self._body_send.close()

    async def body_chunks(self) -> AsyncIterator[bytes]:
        """The request body as it arrives (through the pump)."""
        if self._body_recv is None:
            self._start_pump(body=True)
        assert self._body_recv is not None
        async for chunk in self._body_recv:
            yield chunk

    async def read_body(self, limit: int) -> bytes:
        """The whole body, read straight from `receive()`, or BodyTooLarge once it passes
        `limit` bytes. A disconnect meanwhile cancels the handler, as the pump would."""
        assert self._handler is not None and self._body_recv is None, "read_body reads first"
        parts: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            kind = message.get("type")
            if kind == "http.disconnect":
                self._gone()
                await asyncio.sleep(0)  # raises: this task is cancelled
            if kind != "http.request":
                continue
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(size)
                parts.append(chunk)
            if not message.get("more_body", False):
                break
        self._start_pump(body=False)  # from now on, only a disconnect can arrive
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read_prefix(self, limit: int) -> tuple[bytes, bool]:
        """Up to about `limit` bytes of body, and whether that was the whole body."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.body_chunks():
            parts.append(chunk)
            size += len(chunk)
            if size >= limit:
                return b"".join(parts), False
        return b"".join(parts), True

    async def rest(self, prefix: bytes) -> AsyncIterator[bytes]:
        """The body from `prefix` on, as a stream for the upstream client."""
        if prefix:
            yield prefix
        async for chunk in self.body_chunks():
            yield chunk

    async def run(self, handler: Callable[[], Awaitable[None]]) -> None:
        """Run `handler` until it returns or the client disconnects, whichever is first.
        The handler reads the body with `read_body` or through `body_chunks`.

        Plain asyncio rather than an anyio task group: the group's entry, its pump task
        and its closing cancel (which formats the task's repr for its reason) cost about
        50 us a request, on every proxied request. A disconnect cancels this task; that
        one cancellation is taken back here (`uncancel`), any other goes on."""
        task = asyncio.current_task()
        assert task is not None, "Downstream.run runs in a task"
        self._handler = task
        try:
            await handler()
        except asyncio.CancelledError:
            if not self.disconnected or task.uncancel() > 0:
                raise  # cancelled from outside too (server shutdown): not ours to end
        finally:
            self._handler = None
            pump = self._pump_task
            if pump is not None and not pump.done():
                pump.cancel()


def _retrieve(task: asyncio.Task[None]) -> None:
    """A pump that failed (receive() raised) no longer watches for a disconnect: said in
    the log (asyncio would otherwise report it only as never retrieved, at collection)."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("the request's disconnect watch failed", exc_info=error)
