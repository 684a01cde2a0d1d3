"""How much unlearned work may pile up: a bounded extraction backlog, in total and per
tenant.

The backlog (pending, leased and draft jobs) is read from the queue at most once a
second and counted up locally in between, so a check costs no query on most requests.
Past either limit a new exchange is not learned: its status says `shed`, the shed is
counted in metrics and logged (at most once a second). Answers are never delayed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from memory_core.jobs import JobQueue

log = logging.getLogger("memrelay.learning")


class Backlog:
    """Admits a new job while the backlog is under its limits."""

    def __init__(
        self, queue: JobQueue, total: int, per_tenant: int, refresh_seconds: float = 1.0
    ) -> None:
        self.queue = queue
        self.total = total
        self.per_tenant = per_tenant
        self.refresh_seconds = refresh_seconds
        self.counts: Counter[str] = Counter()
        self.read_at = float("-inf")
        self.shed = 0
        self._logged_at = float("-inf")
        self._lock = asyncio.Lock()

    async def _refresh(self) -> None:
        if time.monotonic() - self.read_at < self.refresh_seconds:
            return
        async with self._lock:
            if time.monotonic() - self.read_at < self.refresh_seconds:
                return
            try:
                self.counts = Counter(await self.queue.backlog())
            except Exception as exc:  # keep the last known counts
                log.warning("could not read the extraction backlog: %s", exc)
            self.read_at = time.monotonic()

    async def admit(self, tenant: str) -> bool:
        """True (and counted) when one more job of `tenant` fits."""
        await self._refresh()
        if sum(self.counts.values()) >= self.total or self.counts[tenant] >= self.per_tenant:
            self.shed += 1
            if time.monotonic() - self._logged_at >= 1.0:
                self._logged_at = time.monotonic()
                log.warning(
                    "extraction backlog full (tenant %s: %d of %d, all: %d of %d): exchanges"
                    " are shed, not learned (%d so far)",
                    tenant,
                    self.counts[tenant],
                    self.per_tenant,
                    sum(self.counts.values()),
                    self.total,
                    self.shed,
                )
            return False
        self.counts[tenant] += 1
        return True
