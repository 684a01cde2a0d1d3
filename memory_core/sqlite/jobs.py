"""The job queue of the embedded store, on the store's own writer and reader threads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memory_core import dead_jobs, jobs
from memory_core.jobs import Job
from memory_core.model import validate_id
from memory_core.sqlite.store import SQLiteStore


class SQLiteJobs:
    """`JobQueue` over the same SQLite file as the memories (one writer for both)."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    async def enqueue(
        self,
        tenant: str,
        space: str,
        payload: dict[str, Any],
        job_id: str | None = None,
        max_attempts: int = 5,
        *,
        forgets: bool = False,
    ) -> Job:
        validate_id(tenant, "tenant")
        validate_id(space, "space")
        return await self.store.run_write(
            lambda c: jobs.enqueue(c, tenant, space, payload, job_id, max_attempts, forgets)
        )

    async def claim(self, owner: str, lease_seconds: float) -> Job | None:
        return await self.store.run_write(lambda c: jobs.claim(c, owner, lease_seconds))

    async def complete(self, job_id: str, owner: str, result: dict[str, Any]) -> None:
        await self.store.run_write(lambda c: jobs.complete(c, job_id, owner, result))

    async def fail(self, job_id: str, owner: str, error: str, retry_in: float) -> Job:
        return await self.store.run_write(lambda c: jobs.fail(c, job_id, owner, error, retry_in))

    async def release(self, job_id: str, owner: str) -> None:
        await self.store.run_write(lambda c: jobs.release(c, job_id, owner))

    async def release_all(self, owner: str) -> int:
        return await self.store.run_write(lambda c: jobs.release_all(c, owner))

    async def extend(self, job_id: str, owner: str, lease_seconds: float) -> bool:
        return await self.store.run_write(lambda c: jobs.extend(c, job_id, owner, lease_seconds))

    async def reserve(
        self,
        tenant: str,
        space: str,
        payload: dict[str, Any],
        job_id: str,
        max_attempts: int,
        digest: str | None,
        dedup_since: float,
        *,
        forgets: bool = False,
    ) -> Job | None:
        validate_id(tenant, "tenant")
        validate_id(space, "space")
        return await self.store.run_write(
            lambda c: jobs.reserve(
                c, tenant, space, payload, job_id, max_attempts, digest, dedup_since, forgets
            )
        )

    async def finish_draft(self, job_id: str, payload: dict[str, Any]) -> bool:
        return await self.store.run_write(lambda c: jobs.finish_draft(c, job_id, payload))

    async def drop_draft(self, job_id: str) -> None:
        await self.store.run_write(lambda c: jobs.drop_draft(c, job_id))

    async def backlog(self) -> dict[str, int]:
        return await self.store.run_read(jobs.backlog)

    async def oldest_pending_at(self) -> float | None:
        return await self.store.run_read(jobs.oldest_pending_at)

    async def prune(self, done_before: float, drafts_before: float) -> tuple[int, int]:
        return await self.store.run_write(lambda c: jobs.prune(c, done_before, drafts_before))

    async def purge(self, tenant: str, job_id: str) -> None:
        validate_id(tenant, "tenant")
        await self.store.run_write(lambda c: jobs.purge(c, tenant, job_id))

    async def retry(self, tenant: str, job_id: str) -> Job:
        validate_id(tenant, "tenant")
        return await self.store.run_write(lambda c: jobs.retry(c, tenant, job_id))

    async def erase_dead(
        self,
        tenant: str,
        spaces: list[str],
        holds: Callable[[dict[str, Any]], bool],
        by_job: str | None = None,
    ) -> list[str]:
        validate_id(tenant, "tenant")
        return await self.store.run_write(
            lambda c: dead_jobs.erase_dead(c, tenant, spaces, holds, by_job)
        )

    async def get_job(self, tenant: str, job_id: str) -> Job | None:
        return await self.store.run_read(lambda c: jobs.get_job(c, tenant, job_id))

    async def list_jobs(
        self, tenant: str | None, statuses: list[str] | None = None, limit: int = 100
    ) -> list[Job]:
        return await self.store.run_read(lambda c: jobs.list_jobs(c, tenant, statuses, limit))

    async def job_counts(self, tenant: str | None = None) -> dict[str, int]:
        return await self.store.run_read(lambda c: jobs.job_counts(c, tenant))
