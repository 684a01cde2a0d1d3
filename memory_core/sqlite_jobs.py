"""The job queue of the embedded store, on the store's own writer and reader threads."""

from __future__ import annotations

from typing import Any

from memory_core import jobs
from memory_core.jobs import Job
from memory_core.model import validate_id
from memory_core.sqlite_store import SQLiteStore


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
    ) -> Job:
        validate_id(tenant, "tenant")
        validate_id(space, "space")
        return await self.store.run_write(
            lambda c: jobs.enqueue(c, tenant, space, payload, job_id, max_attempts)
        )

    async def claim(self, owner: str, lease_seconds: float) -> Job | None:
        return await self.store.run_write(lambda c: jobs.claim(c, owner, lease_seconds))

    async def complete(self, job_id: str, owner: str, result: dict[str, Any]) -> None:
        await self.store.run_write(lambda c: jobs.complete(c, job_id, owner, result))

    async def fail(self, job_id: str, owner: str, error: str, retry_in: float) -> Job:
        return await self.store.run_write(lambda c: jobs.fail(c, job_id, owner, error, retry_in))

    async def release(self, job_id: str, owner: str) -> None:
        await self.store.run_write(lambda c: jobs.release(c, job_id, owner))

    async def release_all(self, owner: str | None = None) -> int:
        return await self.store.run_write(lambda c: jobs.release_all(c, owner))

    async def retry(self, tenant: str, job_id: str) -> Job:
        validate_id(tenant, "tenant")
        return await self.store.run_write(lambda c: jobs.retry(c, tenant, job_id))

    async def get_job(self, tenant: str, job_id: str) -> Job | None:
        return await self.store.run_read(lambda c: jobs.get_job(c, tenant, job_id))

    async def list_jobs(
        self, tenant: str | None, statuses: list[str] | None = None, limit: int = 100
    ) -> list[Job]:
        return await self.store.run_read(lambda c: jobs.list_jobs(c, tenant, statuses, limit))

    async def job_counts(self, tenant: str | None = None) -> dict[str, int]:
        return await self.store.run_read(lambda c: jobs.job_counts(c, tenant))
