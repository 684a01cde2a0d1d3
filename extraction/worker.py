"""Background workers that drain the extraction queue.

Started and stopped with the app (strong references held); each claims one job at a
time. On shutdown a worker finishes its job within a grace period or gives it back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections import Counter
from typing import Any

from extraction.entities import EntityExtractor
from extraction.llm import LLMClient
from extraction.pipeline import learn
from extraction.reconcile import LLMContext, Reconciler
from memory_core.jobs import Job, JobQueue

log = logging.getLogger("memrelay.extraction")


class CredentialCache:
    """Upstream credentials of queued jobs, held in memory only (never written to disk).

    After a restart they are gone: such jobs use the configured extraction key, if any.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self._entries: dict[str, dict[str, str]] = {}
        self.max_entries = max_entries

    def put(self, job_id: str, credentials: dict[str, str]) -> None:
        if len(self._entries) >= self.max_entries:
            self._entries.pop(next(iter(self._entries)))
        self._entries[job_id] = credentials

    def get(self, job_id: str) -> dict[str, str]:
        return self._entries.get(job_id, {})

    def drop(self, job_id: str) -> None:
        self._entries.pop(job_id, None)


class ExtractionWorkers:
    """`concurrency` asyncio tasks claiming and processing jobs until closed."""

    def __init__(
        self,
        queue: JobQueue,
        llm: LLMClient,
        reconciler: Reconciler,
        *,
        credentials: CredentialCache | None = None,
        entities: EntityExtractor | None = None,
        concurrency: int = 2,
        lease_seconds: float = 120.0,
        poll_seconds: float = 0.25,
        retry_base_seconds: float = 2.0,
        grace_seconds: float = 10.0,
    ) -> None:
        self.queue = queue
        self.llm = llm
        self.reconciler = reconciler
        self.credentials = credentials or CredentialCache()
        self.entities = entities
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.retry_base_seconds = retry_base_seconds
        self.grace_seconds = grace_seconds
        # Host and pid in the lease owner tell an operator which replica holds a job.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.counts: Counter[str] = Counter()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()

    async def start(self) -> None:
        # Leases of a previous run of this process are stale: hand them out again.
        released = await self.queue.release_all()
        if released:
            log.info("released %d jobs leased before a restart", released)
        self._stopping = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._loop(i), name=f"extraction-worker-{i}")
            for i in range(self.concurrency)
        ]

    def wake(self) -> None:
        """Tell idle workers a job was enqueued."""
        self._wake.set()

    async def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        if not self._tasks:
            return
        _done, pending = await asyncio.wait(self._tasks, timeout=self.grace_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _loop(self, index: int) -> None:
        owner = f"{self.owner}-{index}"
        while not self._stopping.is_set():
            try:
                job = await self.queue.claim(owner, self.lease_seconds)
            except Exception:
                log.exception("could not claim a job")
                job = None
            if job is None:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.poll_seconds)
                except TimeoutError:
                    pass
                continue
            try:
                await self.process(job, owner)
            except asyncio.CancelledError:
                await asyncio.shield(self._give_back(job, owner))
                raise

    async def _give_back(self, job: Job, owner: str) -> None:
        try:
            await self.queue.release(job.id, owner)
        except Exception:
            log.exception("could not release job %s; its lease will expire", job.id)

    async def process(self, job: Job, owner: str) -> None:
        """Extract and reconcile one job; record success, retry or dead-letter."""
        started = time.perf_counter()
        try:
            result = await self._run(job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            retry_in = self.retry_base_seconds * (2 ** max(0, job.attempts - 1))
            failed = await self.queue.fail(job.id, owner, f"{type(exc).__name__}: {exc}", retry_in)
            self.counts["dead" if failed.status == "dead" else "failed"] += 1
            if failed.status == "dead":
                self.credentials.drop(job.id)
            # The error text may quote model output (memory content): details only at DEBUG.
            log.warning(
                "job %s failed (attempt %d of %d): %s",
                job.id,
                job.attempts,
                job.max_attempts,
                type(exc).__name__,
            )
            log.debug("job %s failure detail", job.id, exc_info=exc)
            return
        result["ms"] = round((time.perf_counter() - started) * 1000, 1)
        await self.queue.complete(job.id, owner, result)
        self.credentials.drop(job.id)
        self.counts["done"] += 1

    async def _run(self, job: Job) -> dict[str, Any]:
        context = LLMContext((job.payload or {}).get("model"), self.credentials.get(job.id))
        return await learn(
            job.id,
            job.tenant,
            job.space,
            job.payload or {},
            self.llm,
            self.reconciler,
            context,
            self.entities,
            job.created_at,
        )
