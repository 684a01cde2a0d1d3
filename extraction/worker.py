"""Background workers that drain the extraction queue, supervised.

Started and stopped with the app (strong references held); each claims one job at a
time. No exception from one job ends a worker: it is logged with the job id and cause
and counted. A worker task that dies anyway is restarted and counted. While a job runs
a heartbeat extends its lease, so a slow model never loses it; a lease lost all the
same (the process stalled) is logged and the job left to its new owner. A process
owns its leases under one identity (host:pid:boot id) and gives back only those. On
shutdown a worker finishes its job within a grace period or gives it back. A pruner
deletes done jobs past their retention and drafts whose process died mid-answer.
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
from extraction.llm import LLMClient, LLMOutputError
from extraction.pipeline import learn
from extraction.reconcile import LLMContext, Reconciler
from memory_core.errors import InvalidInput
from memory_core.jobs import Job, JobQueue

log = logging.getLogger("memrelay.extraction")
BOOT_ID = uuid.uuid4().hex[:8]


def process_identity() -> str:
    """Who holds a lease: host and pid tell an operator which replica; the boot id tells
    this run of a process from an earlier one that had the same pid."""
    return f"{socket.gethostname()}:{os.getpid()}:{BOOT_ID}"


class CredentialCache:
    """Upstream credentials of queued jobs, held in memory only (never written to disk).

    An entry lives as long as its job: dropped when the job is done, dead, dropped, or
    found finished by another replica. Its size is bounded by the backlog limits. After
    a restart they are gone: such jobs use the configured extraction key, if any.
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[str, dict[str, str], float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, job_id: str, credentials: dict[str, str], tenant: str = "") -> None:
        self._entries[job_id] = (tenant, credentials, time.time())

    def get(self, job_id: str) -> dict[str, str]:
        entry = self._entries.get(job_id)
        return entry[1] if entry else {}

    def drop(self, job_id: str) -> None:
        self._entries.pop(job_id, None)

    def older_than(self, at: float) -> list[tuple[str, str]]:
        """(job id, tenant) of entries put before `at`."""
        return [(job_id, e[0]) for job_id, e in self._entries.items() if e[2] < at]


class ChatActivity:
    """Users' chats in flight. With the embedded llama.cpp, workers claim only while no
    chat is in flight, so extraction never takes a slot a user is waiting for."""

    def __init__(self) -> None:
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def begin(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def end(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()


class ExtractionWorkers:
    """`concurrency` supervised asyncio tasks claiming and processing jobs until closed."""

    def __init__(
        self,
        queue: JobQueue,
        llm: LLMClient,
        reconciler: Reconciler,
        *,
        credentials: CredentialCache | None = None,
        entities: EntityExtractor | None = None,
        concurrency: int = 2,
        lease_seconds: float = 60.0,
        poll_seconds: float = 0.25,
        retry_base_seconds: float = 2.0,
        grace_seconds: float = 10.0,
        done_retention_seconds: float = 86_400.0,
        draft_max_age_seconds: float = 900.0,
        prune_every_seconds: float = 60.0,
        yield_to: ChatActivity | None = None,
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
        self.done_retention_seconds = done_retention_seconds
        self.draft_max_age_seconds = draft_max_age_seconds
        self.prune_every_seconds = prune_every_seconds
        self.yield_to = yield_to
        self.owner = process_identity()
        self.counts: Counter[str] = Counter()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._pruner: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()

    async def start(self) -> None:
        # Nothing to release: a new process has a new identity, so it holds no lease yet;
        # those of an earlier run (or of any other process) run out by time.
        self._stopping = asyncio.Event()
        for index in range(self.concurrency):
            self._spawn(index)
        self._pruner = asyncio.create_task(self._prune_loop(), name="extraction-pruner")

    def _spawn(self, index: int) -> None:
        task = asyncio.create_task(self._loop(index), name=f"extraction-worker-{index}")
        self._tasks[index] = task
        task.add_done_callback(lambda t, i=index: self._ended(i, t))

    def _ended(self, index: int, task: asyncio.Task[None]) -> None:
        """Supervisor: a worker that ends while the app runs is logged and restarted."""
        if self._stopping.is_set() or self._tasks.get(index) is not task:
            return
        cause = "cancelled" if task.cancelled() else repr(task.exception())
        self.counts["restarts"] += 1
        log.error("extraction worker %d ended (%s); restarting it", index, cause)
        self._spawn(index)

    @property
    def alive(self) -> int:
        return sum(1 for task in self._tasks.values() if not task.done())

    async def health(self) -> dict[str, Any]:
        """The learning loop's health for readyz and metrics."""
        oldest = await self.queue.oldest_pending_at()
        backlog = await self.queue.backlog()
        return {
            "workers": self.concurrency,
            "workers_alive": self.alive,
            "worker_restarts": self.counts["restarts"],
            "backlog": sum(backlog.values()),
            "oldest_pending_seconds": round(time.time() - oldest, 1) if oldest else 0.0,
            "yielding_to_chats": bool(self.yield_to and self.yield_to.in_flight),
        }

    def wake(self) -> None:
        """Tell idle workers a job was enqueued."""
        self._wake.set()

    async def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        tasks = list(self._tasks.values())
        if self._pruner is not None:
            self._pruner.cancel()
            tasks.append(self._pruner)
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=self.grace_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = {}
        self._pruner = None

    async def _idle(self, seconds: float) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass

    async def _loop(self, index: int) -> None:
        owner = f"{self.owner}-{index}"
        while not self._stopping.is_set():
            if self.yield_to is not None and self.yield_to.in_flight:
                await self._idle(self.poll_seconds)  # users first
                continue
            try:
                job = await self.queue.claim(owner, self.lease_seconds)
            except Exception as exc:
                self.counts["claim_errors"] += 1
                log.error("could not claim a job: %s: %s", type(exc).__name__, exc)
                await self._idle(self.poll_seconds * 4)
                continue
            if job is None:
                await self._idle(self.poll_seconds)
                continue
            try:
                await self._hold(job, owner)
            except asyncio.CancelledError:
                await asyncio.shield(self._give_back(job, owner))
                raise
            except Exception as exc:
                self.counts["errors"] += 1
                log.error(
                    "job %s: unexpected %s: %s; the worker goes on",
                    job.id,
                    type(exc).__name__,
                    exc,
                    exc_info=exc,
                )

    async def _hold(self, job: Job, owner: str) -> None:
        """Process `job` while a heartbeat keeps its lease; stop if the lease is lost."""
        work = asyncio.create_task(self.process(job, owner), name=f"job-{job.id}")
        beat = asyncio.create_task(self._heartbeat(job.id, owner), name=f"lease-{job.id}")
        try:
            await asyncio.wait({work, beat}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise
        finally:
            beat.cancel()
        if work.done():
            work.result()  # re-raises what process() raised
            return
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        self._lease_lost(job)

    async def _heartbeat(self, job_id: str, owner: str) -> None:
        """Returns only when the lease is gone (then the job belongs to someone else)."""
        every = max(0.05, self.lease_seconds / 3)
        while True:
            await asyncio.sleep(every)
            try:
                if not await self.queue.extend(job_id, owner, self.lease_seconds):
                    return
            except Exception as exc:  # the database hiccuped: try again; the lease may run out
                log.warning("job %s: could not extend its lease: %s", job_id, exc)

    def _lease_lost(self, job: Job) -> None:
        self.counts["lease_lost"] += 1
        log.warning(
            "job %s: lease lost (it ran out while this process stalled); left to its new owner",
            job.id,
        )

    async def _give_back(self, job: Job, owner: str) -> None:
        try:
            await self.queue.release(job.id, owner)
        except Exception:
            log.exception("could not release job %s; its lease will expire", job.id)

    async def _prune_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.prune()
            except Exception as exc:
                log.error("pruning the job queue failed: %s: %s", type(exc).__name__, exc)
            try:
                await asyncio.wait_for(self._stopping.wait(), self.prune_every_seconds)
            except TimeoutError:
                pass

    async def prune(self) -> None:
        """Delete done jobs past retention and orphaned drafts; forget credentials whose
        jobs are no longer waiting (finished here or by another replica)."""
        now = time.time()
        done, drafts = await self.queue.prune(
            now - self.done_retention_seconds, now - self.draft_max_age_seconds
        )
        self.counts["pruned"] += done
        self.counts["drafts_pruned"] += drafts
        if done or drafts:
            log.info("pruned %d done jobs and %d orphaned drafts", done, drafts)
        for job_id, tenant in self.credentials.older_than(now - self.prune_every_seconds):
            job = await self.queue.get_job(tenant, job_id) if tenant else None
            if job is None or job.status in ("done", "dead"):
                self.credentials.drop(job_id)

    async def process(self, job: Job, owner: str) -> None:
        """Extract and reconcile one job; record success, retry or dead-letter."""
        started = time.perf_counter()
        try:
            result = await self._run(job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            retry_in = self.retry_base_seconds * (2 ** max(0, job.attempts - 1))
            try:
                failed = await self.queue.fail(job.id, owner, failure_text(exc), retry_in)
            except InvalidInput:
                self._lease_lost(job)
                return
            self.counts["dead" if failed.status == "dead" else "failed"] += 1
            if failed.status == "dead":
                self.credentials.drop(job.id)
            # Model output (memory content) is never logged: LLM errors say only the cause.
            log.warning(
                "job %s failed (attempt %d of %d): %s",
                job.id,
                job.attempts,
                job.max_attempts,
                log_cause(exc),
            )
            log.debug("job %s failure detail", job.id, exc_info=exc)
            return
        result["ms"] = round((time.perf_counter() - started) * 1000, 1)
        try:
            await self.queue.complete(job.id, owner, result)
        except InvalidInput:
            self._lease_lost(job)
            return
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


def failure_text(exc: BaseException, limit: int = 2000) -> str:
    """`Type: message` for last_error; never an empty reason."""
    message = str(exc).strip() or (type(exc).__doc__ or "no detail").strip().splitlines()[0]
    return f"{type(exc).__name__}: {message}"[:limit]


def log_cause(exc: BaseException) -> str:
    """The cause for the log: in full, unless the message may quote model output (memory
    content), which stays in last_error only."""
    if isinstance(exc, LLMOutputError | ValueError):
        return f"{type(exc).__name__} (the model's output was unusable; see last_error)"
    return failure_text(exc, 500)
