"""The extraction queue in Postgres, shared by every replica.

Same contract as the SQLite queue (`memory_core.jobs`): leases that run out, strict
order within a tenant and space (a forget job after every earlier job of its tenant),
backoff, dead letters, payloads cleared when done. Across replicas, a claim first takes
a transaction-scoped advisory lock on the job's tenant and space, then re-checks (fresh
snapshot) that the job is still the head of its scope with nothing leased, and locks
the row with FOR UPDATE SKIP LOCKED. Two replicas can therefore never hold two jobs of
one scope, nor take one out of order. A forget job's wait needs no lock of its own:
what holds it back (earlier jobs pending or leased) only ends, never starts anew
(an operator's retry of a dead job aside). A forget in words erases the payloads of
the dead jobs that hold its words (`erase_dead`, rows locked FOR UPDATE, so a retry
waits for it and then sees the NULL payload it refuses).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from psycopg.types.json import Jsonb

from memory_core.dead_jobs import (
    DEAD_WITH_PAYLOAD_SQL,
    ERASE_PAGE,
    ERASE_SQL,
    erased_marks,
    erased_message,
)
from memory_core.errors import InvalidInput, NotFound
from memory_core.jobs import (
    BACKLOG_SQL,
    DUPLICATE_SQL,
    JOB_COLUMNS,
    JOB_STATUSES,
    OLDEST_PENDING_SQL,
    Job,
    job_counts_sql,
    job_from_row,
    list_jobs_sql,
)
from memory_core.jobs import HEAD_OF_SCOPE as SHARED_HEAD_OF_SCOPE
from memory_core.model import validate_id
from memory_core.postgres.store import PostgresStore

SCOPE_LOCK_CLASS = 7_310_002  # first key of the per tenant-and-space advisory locks
HEAD_OF_SCOPE = SHARED_HEAD_OF_SCOPE.format(now="%(now)s")
DEDUP_LOCK_CLASS = 7_310_003  # advisory lock per tenant, space and content hash
CANDIDATES = 16


class PostgresJobs:
    """`JobQueue` over the Postgres store's connection pool."""

    def __init__(self, store: PostgresStore) -> None:
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
        """Add a job; enqueuing the same id twice keeps the first (idempotent)."""
        validate_id(tenant, "tenant")
        validate_id(space, "space")
        now = time.time()
        job_id = job_id or f"job_{uuid.uuid4().hex}"
        async with self.store.connection() as conn:
            await conn.execute(
                "INSERT INTO jobs (id, tenant, space, status, payload, max_attempts,"
                " available_at, created_at, updated_at, forgets)"
                " VALUES (%s, %s, %s, 'pending', %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (id) DO NOTHING",
                (job_id, tenant, space, Jsonb(payload), max_attempts, now, now, now, forgets),
            )
        return await self._get(job_id)

    async def claim(self, owner: str, lease_seconds: float) -> Job | None:
        now = time.time()
        async with self.store.connection() as conn:
            await conn.execute(
                "UPDATE jobs SET status = 'pending', lease_owner = NULL, lease_until = NULL,"
                " updated_at = %s WHERE status = 'leased' AND lease_until <= %s",
                (now, now),
            )
            await conn.commit()
            cursor = await conn.execute(
                f"SELECT j.id, j.tenant, j.space FROM jobs j WHERE {HEAD_OF_SCOPE}"
                " ORDER BY j.seq LIMIT %(limit)s",
                {"now": now, "limit": CANDIDATES},
            )
            heads = await cursor.fetchall()
            await conn.commit()
            for job_id, tenant, space in heads:
                async with conn.transaction():
                    cursor = await conn.execute(
                        "SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))",
                        (SCOPE_LOCK_CLASS, f"{tenant}\x1f{space}"),
                    )
                    if not (await cursor.fetchone())[0]:
                        continue  # another replica is claiming in this scope right now
                    cursor = await conn.execute(
                        f"SELECT j.id FROM jobs j WHERE j.id = %(id)s AND {HEAD_OF_SCOPE}"
                        " FOR UPDATE SKIP LOCKED",
                        {"id": job_id, "now": now},
                    )
                    if await cursor.fetchone() is None:
                        continue
                    cursor = await conn.execute(
                        "UPDATE jobs SET status = 'leased', lease_owner = %s, lease_until = %s,"
                        f" attempts = attempts + 1, updated_at = %s WHERE id = %s"
                        f" RETURNING {JOB_COLUMNS}",
                        (owner, now + lease_seconds, now, job_id),
                    )
                    return job_from_row(await cursor.fetchone())
        return None

    async def complete(self, job_id: str, owner: str, result: dict[str, Any]) -> None:
        await self._update_owned(
            job_id,
            owner,
            "status = 'done', payload = NULL, result = %s, lease_owner = NULL,"
            " lease_until = NULL, last_error = NULL, updated_at = %s",
            (Jsonb(result), time.time()),
        )

    async def fail(self, job_id: str, owner: str, error: str, retry_in: float) -> Job:
        """Back to pending after `retry_in` seconds, or dead once attempts are used up."""
        now = time.time()
        return await self._update_owned(
            job_id,
            owner,
            "status = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END,"
            " available_at = %s, last_error = %s, lease_owner = NULL, lease_until = NULL,"
            " updated_at = %s",
            (now + retry_in, error[:2000], now),
        )

    async def release(self, job_id: str, owner: str) -> None:
        """Give a leased job back untouched (shutdown); its attempt is not counted."""
        await self._update_owned(
            job_id,
            owner,
            "status = 'pending', attempts = greatest(0, attempts - 1), lease_owner = NULL,"
            " lease_until = NULL, updated_at = %s",
            (time.time(),),
        )

    async def release_all(self, owner: str) -> int:
        """Give back the leases of `owner` and its workers (`owner-N`), never others'."""
        if not owner:
            raise InvalidInput("release_all needs an owner")
        async with self.store.connection() as conn:
            cursor = await conn.execute(
                "UPDATE jobs SET status = 'pending', attempts = greatest(0, attempts - 1),"
                " lease_owner = NULL, lease_until = NULL, updated_at = %s"
                " WHERE status = 'leased' AND (lease_owner = %s OR starts_with(lease_owner, %s))",
                (time.time(), owner, owner + "-"),
            )
            return cursor.rowcount

    async def extend(self, job_id: str, owner: str, lease_seconds: float) -> bool:
        now = time.time()
        async with self.store.connection() as conn:
            cursor = await conn.execute(
                "UPDATE jobs SET lease_until = %s, updated_at = %s WHERE id = %s"
                " AND status = 'leased' AND lease_owner = %s",
                (now + lease_seconds, now, job_id, owner),
            )
            return cursor.rowcount > 0

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
        """A draft job, unless the same content was queued in this scope since
        `dedup_since` (None). Replicas serialise on an advisory lock per content."""
        validate_id(tenant, "tenant")
        validate_id(space, "space")
        now = time.time()
        async with self.store.connection() as conn:
            if digest is not None:
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                    (DEDUP_LOCK_CLASS, f"{tenant}\x1f{space}\x1f{digest}"),
                )
                cursor = await conn.execute(
                    DUPLICATE_SQL.format(m="%s"), (tenant, space, digest, dedup_since)
                )
                if await cursor.fetchone() is not None:
                    return None
            cursor = await conn.execute(
                "INSERT INTO jobs (id, tenant, space, status, payload, max_attempts,"
                " available_at, created_at, updated_at, draft, content_hash, forgets)"
                " VALUES (%s, %s, %s, 'pending', %s, %s, %s, %s, %s, true, %s, %s)"
                f" RETURNING {JOB_COLUMNS}",
                (
                    job_id,
                    tenant,
                    space,
                    Jsonb(payload),
                    max_attempts,
                    now,
                    now,
                    now,
                    digest,
                    forgets,
                ),
            )
            return job_from_row(await cursor.fetchone())

    async def finish_draft(self, job_id: str, payload: dict[str, Any]) -> bool:
        now = time.time()
        async with self.store.connection() as conn:
            cursor = await conn.execute(
                "UPDATE jobs SET draft = false, payload = %s, available_at = %s, updated_at = %s"
                " WHERE id = %s AND draft = true",
                (Jsonb(payload), now, now, job_id),
            )
            return cursor.rowcount > 0

    async def drop_draft(self, job_id: str) -> None:
        async with self.store.connection() as conn:
            await conn.execute("DELETE FROM jobs WHERE id = %s AND draft = true", (job_id,))

    async def backlog(self) -> dict[str, int]:
        return dict(await self.store.fetch(BACKLOG_SQL))

    async def oldest_pending_at(self) -> float | None:
        return (await self.store.fetch(OLDEST_PENDING_SQL))[0][0]

    async def prune(self, done_before: float, drafts_before: float) -> tuple[int, int]:
        async with self.store.connection() as conn:
            done = await conn.execute(
                "DELETE FROM jobs WHERE status = 'done' AND updated_at < %s", (done_before,)
            )
            drafts = await conn.execute(
                "DELETE FROM jobs WHERE draft = true AND created_at < %s", (drafts_before,)
            )
            return done.rowcount, drafts.rowcount

    async def purge(self, tenant: str, job_id: str) -> None:
        validate_id(tenant, "tenant")
        async with self.store.connection() as conn:
            cursor = await conn.execute(
                "SELECT status FROM jobs WHERE id = %s AND tenant = %s AND draft = false"
                " FOR UPDATE",
                (job_id, tenant),
            )
            row = await cursor.fetchone()
            if row is None:
                raise NotFound(f"no job {job_id!r} in tenant {tenant!r}")
            if row[0] != "dead":
                raise InvalidInput(f"only dead-lettered jobs can be purged (this one is {row[0]})")
            await conn.execute("DELETE FROM jobs WHERE id = %s", (job_id,))

    async def retry(self, tenant: str, job_id: str) -> Job:
        validate_id(tenant, "tenant")
        async with self.store.connection() as conn:
            cursor = await conn.execute(
                "SELECT status, payload IS NULL FROM jobs WHERE id = %s AND tenant = %s FOR UPDATE",
                (job_id, tenant),
            )
            row = await cursor.fetchone()
            if row is None:
                raise NotFound(f"no job {job_id!r} in tenant {tenant!r}")
            if row[0] != "dead":
                raise InvalidInput(f"only dead-lettered jobs can be retried (this one is {row[0]})")
            if row[1]:
                raise InvalidInput(erased_message(job_id))
            now = time.time()
            await conn.execute(
                "UPDATE jobs SET status = 'pending', attempts = 0, available_at = %s,"
                " updated_at = %s WHERE id = %s",
                (now, now, job_id),
            )
        return await self._get(job_id)

    async def erase_dead(
        self,
        tenant: str,
        spaces: list[str],
        holds: Callable[[dict[str, Any]], bool],
        by_job: str | None = None,
    ) -> list[str]:
        """Erase the payload of every dead job of `tenant` in `spaces` that `holds`
        matches; each page is read FOR UPDATE and erased in one transaction."""
        validate_id(tenant, "tenant")
        if not spaces:
            return []
        sql = DEAD_WITH_PAYLOAD_SQL.format(m="%s", spaces=",".join(["%s"] * len(spaces)))
        reason, result = erased_marks(by_job)
        erased: list[str] = []
        after = 0
        async with self.store.connection() as conn:
            while True:
                async with conn.transaction():
                    cursor = await conn.execute(
                        sql + " FOR UPDATE", (tenant, after, *spaces, ERASE_PAGE)
                    )
                    rows = await cursor.fetchall()
                    for seq, job_id, payload in rows:
                        after = seq
                        if holds(payload):
                            await conn.execute(
                                ERASE_SQL.format(m="%s"),
                                (reason, Jsonb(result), time.time(), job_id),
                            )
                            erased.append(job_id)
                if len(rows) < ERASE_PAGE:
                    return erased

    async def get_job(self, tenant: str, job_id: str) -> Job | None:
        rows = await self.store.fetch(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s AND tenant = %s AND draft = false",
            (job_id, tenant),
        )
        return job_from_row(rows[0]) if rows else None

    async def list_jobs(
        self, tenant: str | None, statuses: list[str] | None = None, limit: int = 100
    ) -> list[Job]:
        sql, params = list_jobs_sql(tenant, statuses, limit, "%s")
        return [job_from_row(row) for row in await self.store.fetch(sql, params)]

    async def job_counts(self, tenant: str | None = None) -> dict[str, int]:
        counts = dict.fromkeys(JOB_STATUSES, 0)
        counts.update(dict(await self.store.fetch(*job_counts_sql(tenant, "%s"))))
        return counts

    async def _get(self, job_id: str) -> Job:
        rows = await self.store.fetch(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s", (job_id,))
        if not rows:
            raise NotFound(f"no job {job_id!r}")
        return job_from_row(rows[0])

    async def _update_owned(
        self, job_id: str, owner: str, assignments: str, params: tuple[Any, ...]
    ) -> Job:
        async with self.store.connection() as conn:
            cursor = await conn.execute(
                f"UPDATE jobs SET {assignments} WHERE id = %s AND status = 'leased'"
                f" AND lease_owner = %s RETURNING {JOB_COLUMNS}",
                (*params, job_id, owner),
            )
            row = await cursor.fetchone()
        if row is None:
            raise InvalidInput(f"job {job_id} is not leased by {owner} (lease lost)")
        return job_from_row(row)
