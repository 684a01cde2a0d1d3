"""The extraction queue: a table beside the memories, so it survives crashes and restarts.

At-least-once: a job is leased for a while; a worker that dies lets the lease run out
and the job is claimed again. Jobs of one tenant and space are claimed strictly in
order and one at a time, so fact N is committed before fact N+1 is reconciled. A job
that keeps failing is dead-lettered with its last error; nothing is dropped. Payloads
(they hold conversation text) are cleared once a job is done.

A job may start as a draft: written (with the request) before the answer's headers
go out, invisible to claims and counts, then finished with the answer or dropped.
Leases name their owner (host:pid:boot id); a process extends the leases it holds
while it works and gives back only its own; a dead process's leases run out by time.
Done jobs are pruned after a retention period; dead jobs stay until retried or purged.

A job holding an explicit forget request ("forget my locker code"; `forgets`, set when
the job is written) also waits until no earlier job of its tenant (lower seq) is pending
or leased, in any space. Why: order is kept per tenant and space, so that job (write
space `work`, reading `personal`) could run while an earlier exchange's job in
`personal`, which stores the locker code, still waits; the code would be learned after
the forget and stay. Checking afterwards instead (a later job re-checking tombstones)
cannot work: what a request asked to forget is never stored, in words or stems, and a
tombstone holds no text. Every space, not only the readable ones, because a job may
write into any space it reads (a successor goes where the memory it replaces was) and
jobs' readable spaces live only in their payloads. Only forget jobs wait: other jobs are
ordered per tenant and space as before, so learning runs in parallel across spaces, and
a forget waits for at most what was queued before it (later jobs never delay it). Dead
jobs and drafts (answers still streaming, as for the scope order) do not hold it back.
The rule is part of the claim query over durable rows, so kill -9 changes nothing.

A dead job keeps its payload for a retry; a forget in words may erase it
(memory_core/dead_jobs.py), and a retry of an erased job is refused.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from memory_core.dead_jobs import erased_message
from memory_core.errors import InvalidInput, NotFound
from memory_core.sqlite.db import Connection

JOB_COLUMNS = (
    "id, tenant, space, status, payload, attempts, max_attempts, available_at, lease_owner,"
    " lease_until, last_error, result, created_at, updated_at, forgets"
)
JOB_STATUSES = ("pending", "leased", "done", "dead")
# A pending job in the same scope with a lower seq, or a leased one, blocks a claim; a
# forget job also waits for every earlier job of its tenant (see the module docstring).
HEAD_OF_SCOPE = (
    "j.status = 'pending' AND j.draft = false AND j.available_at <= {now}"
    " AND NOT EXISTS (SELECT 1 FROM jobs k WHERE k.tenant = j.tenant AND k.space = j.space"
    "   AND k.draft = false"
    "   AND (k.status = 'leased' OR (k.status = 'pending' AND k.seq < j.seq)))"
    " AND (j.forgets = false OR NOT EXISTS (SELECT 1 FROM jobs f WHERE f.tenant = j.tenant"
    "   AND f.status IN ('pending', 'leased') AND f.draft = false AND f.seq < j.seq))"
)
BACKLOG_SQL = (
    "SELECT tenant, count(*) FROM jobs WHERE status IN ('pending', 'leased') GROUP BY tenant"
)
OLDEST_PENDING_SQL = (
    "SELECT min(created_at) FROM jobs WHERE status IN ('pending', 'leased') AND draft = false"
)
DUPLICATE_SQL = (
    "SELECT id FROM jobs WHERE tenant = {m} AND space = {m} AND content_hash = {m}"
    " AND created_at >= {m} AND status <> 'dead' LIMIT 1"
)


def content_hash(parts: object) -> str:
    """A stable digest of what a job learns from (scope and messages): the same request
    sent twice hashes the same."""
    text = json.dumps(parts, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Job:
    id: str
    tenant: str
    space: str
    status: str
    payload: dict[str, Any] | None
    attempts: int
    max_attempts: int
    available_at: float
    lease_owner: str | None
    lease_until: float | None
    last_error: str | None
    result: dict[str, Any] | None
    created_at: float
    updated_at: float
    forgets: bool = False  # the user's message holds a forget request (module docstring)

    @property
    def erased(self) -> bool:
        """A dead job whose conversation a forget erased: it can be purged, never retried
        (memory_core/dead_jobs.py)."""
        return bool(self.result and self.result.get("erased"))

    def as_dict(self, with_payload: bool = False) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if not with_payload:
            data.pop("payload")
        return data


def job_from_row(row: tuple[Any, ...]) -> Job:
    """SQLite stores payload and result as JSON text; Postgres jsonb comes back decoded."""
    values = list(row)
    for i in (4, 11):
        values[i] = json.loads(values[i]) if isinstance(values[i], str) else values[i]
    values[14] = bool(values[14])
    return Job(*values)


class JobQueue(Protocol):
    async def enqueue(
        self,
        tenant: str,
        space: str,
        payload: dict[str, Any],
        job_id: str | None = None,
        max_attempts: int = 5,
        *,
        forgets: bool = False,
    ) -> Job: ...

    async def claim(self, owner: str, lease_seconds: float) -> Job | None: ...

    async def complete(self, job_id: str, owner: str, result: dict[str, Any]) -> None: ...

    async def fail(self, job_id: str, owner: str, error: str, retry_in: float) -> Job: ...

    async def release(self, job_id: str, owner: str) -> None: ...

    async def release_all(self, owner: str) -> int: ...

    async def extend(self, job_id: str, owner: str, lease_seconds: float) -> bool: ...

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
    ) -> Job | None: ...

    async def finish_draft(self, job_id: str, payload: dict[str, Any]) -> bool: ...

    async def drop_draft(self, job_id: str) -> None: ...

    async def backlog(self) -> dict[str, int]: ...

    async def oldest_pending_at(self) -> float | None: ...

    async def prune(self, done_before: float, drafts_before: float) -> tuple[int, int]: ...

    async def purge(self, tenant: str, job_id: str) -> None: ...

    async def retry(self, tenant: str, job_id: str) -> Job: ...

    async def erase_dead(
        self,
        tenant: str,
        spaces: list[str],
        holds: Callable[[dict[str, Any]], bool],
        by_job: str | None = None,
    ) -> list[str]: ...

    async def get_job(self, tenant: str, job_id: str) -> Job | None: ...

    async def list_jobs(
        self, tenant: str | None, statuses: list[str] | None, limit: int
    ) -> list[Job]: ...

    async def job_counts(self, tenant: str | None = None) -> dict[str, int]: ...


def enqueue(
    conn: Connection,
    tenant: str,
    space: str,
    payload: dict[str, Any],
    job_id: str | None,
    max_attempts: int,
    forgets: bool = False,
) -> Job:
    """Add a job; enqueuing the same id twice keeps the first (idempotent)."""
    now = time.time()
    job_id = job_id or f"job_{uuid.uuid4().hex}"
    conn.execute(
        "INSERT OR IGNORE INTO jobs (id, tenant, space, status, payload, max_attempts,"
        " available_at, created_at, updated_at, forgets)"
        " VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)",
        (job_id, tenant, space, json.dumps(payload), max_attempts, now, now, now, forgets),
    )
    return _get(conn, job_id)


def claim(conn: Connection, owner: str, lease_seconds: float) -> Job | None:
    """Lease the oldest runnable job whose tenant and space have nothing older pending
    and nothing leased (a forget job: nothing older of its tenant in any space); expired
    leases count as pending again."""
    now = time.time()
    conn.execute(
        "UPDATE jobs SET status = 'pending', lease_owner = NULL, lease_until = NULL,"
        " updated_at = ? WHERE status = 'leased' AND lease_until <= ?",
        (now, now),
    )
    row = conn.execute(
        f"SELECT j.id FROM jobs j WHERE {HEAD_OF_SCOPE.format(now='?')} ORDER BY j.seq LIMIT 1",
        (now,),
    ).fetchone()
    if row is None:
        return None
    conn.execute(
        "UPDATE jobs SET status = 'leased', lease_owner = ?, lease_until = ?,"
        " attempts = attempts + 1, updated_at = ? WHERE id = ?",
        (owner, now + lease_seconds, now, row[0]),
    )
    return _get(conn, row[0])


def complete(conn: Connection, job_id: str, owner: str, result: dict[str, Any]) -> None:
    _owned(conn, job_id, owner)
    conn.execute(
        "UPDATE jobs SET status = 'done', payload = NULL, result = ?, lease_owner = NULL,"
        " lease_until = NULL, last_error = NULL, updated_at = ? WHERE id = ?",
        (json.dumps(result), time.time(), job_id),
    )


def fail(conn: Connection, job_id: str, owner: str, error: str, retry_in: float) -> Job:
    """Back to pending after `retry_in` seconds, or dead once attempts are used up."""
    job = _owned(conn, job_id, owner)
    now = time.time()
    dead = job.attempts >= job.max_attempts
    conn.execute(
        "UPDATE jobs SET status = ?, available_at = ?, last_error = ?, lease_owner = NULL,"
        " lease_until = NULL, updated_at = ? WHERE id = ?",
        ("dead" if dead else "pending", now + retry_in, error[:2000], now, job_id),
    )
    return _get(conn, job_id)


def release(conn: Connection, job_id: str, owner: str) -> None:
    """Give a leased job back untouched (shutdown); its attempt is not counted."""
    _owned(conn, job_id, owner)
    conn.execute(
        "UPDATE jobs SET status = 'pending', attempts = max(0, attempts - 1), lease_owner = NULL,"
        " lease_until = NULL, updated_at = ? WHERE id = ?",
        (time.time(), job_id),
    )


def release_all(conn: Connection, owner: str) -> int:
    """Give back the leases of `owner` (a process identity; its workers' leases are
    `owner-N`). Never another process's: theirs run out by time if that process died."""
    if not owner:
        raise InvalidInput("release_all needs an owner")
    return conn.execute(
        "UPDATE jobs SET status = 'pending', attempts = max(0, attempts - 1), lease_owner = NULL,"
        " lease_until = NULL, updated_at = ? WHERE status = 'leased'"
        " AND (lease_owner = ? OR substr(lease_owner, 1, ?) = ?)",
        (time.time(), owner, len(owner) + 1, owner + "-"),
    ).rowcount


def extend(conn: Connection, job_id: str, owner: str, lease_seconds: float) -> bool:
    """Push the lease of a job `owner` still holds; False when the lease was lost."""
    now = time.time()
    return (
        conn.execute(
            "UPDATE jobs SET lease_until = ?, updated_at = ? WHERE id = ? AND status = 'leased'"
            " AND lease_owner = ?",
            (now + lease_seconds, now, job_id, owner),
        ).rowcount
        > 0
    )


def reserve(
    conn: Connection,
    tenant: str,
    space: str,
    payload: dict[str, Any],
    job_id: str,
    max_attempts: int,
    digest: str | None,
    dedup_since: float,
    forgets: bool = False,
) -> Job | None:
    """Write a draft job (not claimable, not counted) unless the same content was queued
    in this scope since `dedup_since` (then None: it is already one piece of evidence)."""
    if digest is not None:
        sql = DUPLICATE_SQL.format(m="?")
        if conn.execute(sql, (tenant, space, digest, dedup_since)).fetchone() is not None:
            return None
    now = time.time()
    conn.execute(
        "INSERT INTO jobs (id, tenant, space, status, payload, max_attempts, available_at,"
        " created_at, updated_at, draft, content_hash, forgets)"
        " VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, true, ?, ?)",
        (job_id, tenant, space, json.dumps(payload), max_attempts, now, now, now, digest, forgets),
    )
    return _get(conn, job_id)


def finish_draft(conn: Connection, job_id: str, payload: dict[str, Any]) -> bool:
    """The answer is complete: the draft becomes a claimable job holding it."""
    now = time.time()
    return (
        conn.execute(
            "UPDATE jobs SET draft = false, payload = ?, available_at = ?, updated_at = ?"
            " WHERE id = ? AND draft = true",
            (json.dumps(payload), now, now, job_id),
        ).rowcount
        > 0
    )


def drop_draft(conn: Connection, job_id: str) -> None:
    conn.execute("DELETE FROM jobs WHERE id = ? AND draft = true", (job_id,))


def backlog(conn: Connection) -> dict[str, int]:
    """Pending and leased jobs (drafts included) per tenant."""
    return dict(conn.execute(BACKLOG_SQL).fetchall())


def oldest_pending_at(conn: Connection) -> float | None:
    return conn.execute(OLDEST_PENDING_SQL).fetchone()[0]


def prune(conn: Connection, done_before: float, drafts_before: float) -> tuple[int, int]:
    """Delete done jobs finished before `done_before` and drafts written before
    `drafts_before` (their process died mid-answer); dead jobs are kept."""
    done = conn.execute(
        "DELETE FROM jobs WHERE status = 'done' AND updated_at < ?", (done_before,)
    ).rowcount
    drafts = conn.execute(
        "DELETE FROM jobs WHERE draft = true AND created_at < ?", (drafts_before,)
    ).rowcount
    return done, drafts


def purge(conn: Connection, tenant: str, job_id: str) -> None:
    """The operator deletes a dead-lettered job."""
    job = _get(conn, job_id)
    if job.tenant != tenant:
        raise NotFound(f"no job {job_id!r} in tenant {tenant!r}")
    if job.status != "dead":
        raise InvalidInput(f"only dead-lettered jobs can be purged (this one is {job.status})")
    conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))


def retry(conn: Connection, tenant: str, job_id: str) -> Job:
    job = _get(conn, job_id)
    if job.tenant != tenant:
        raise NotFound(f"no job {job_id!r} in tenant {tenant!r}")
    if job.status != "dead":
        raise InvalidInput(f"only dead-lettered jobs can be retried (this one is {job.status})")
    if job.payload is None:
        raise InvalidInput(erased_message(job_id))
    conn.execute(
        "UPDATE jobs SET status = 'pending', attempts = 0, available_at = ?, updated_at = ?"
        " WHERE id = ?",
        (time.time(), time.time(), job_id),
    )
    return _get(conn, job_id)


def list_jobs_sql(
    tenant: str | None, statuses: list[str] | None, limit: int, mark: str = "?"
) -> tuple[str, list[Any]]:
    """Newest jobs first, optionally of one tenant and some statuses."""
    sql = f"SELECT {JOB_COLUMNS} FROM jobs WHERE draft = false"
    params: list[Any] = []
    if tenant is not None:
        sql += f" AND tenant = {mark}"
        params.append(tenant)
    if statuses:
        for status in statuses:
            if status not in JOB_STATUSES:
                raise InvalidInput(f"job status must be one of {', '.join(JOB_STATUSES)}")
        sql += f" AND status IN ({','.join([mark] * len(statuses))})"
        params += statuses
    sql += f" ORDER BY seq DESC LIMIT {mark}"
    params.append(limit)
    return sql, params


def job_counts_sql(tenant: str | None, mark: str = "?") -> tuple[str, list[Any]]:
    if tenant is None:
        return "SELECT status, count(*) FROM jobs WHERE draft = false GROUP BY status", []
    return (
        f"SELECT status, count(*) FROM jobs WHERE draft = false AND tenant = {mark}"
        " GROUP BY status",
        [tenant],
    )


def list_jobs(
    conn: Connection, tenant: str | None, statuses: list[str] | None, limit: int
) -> list[Job]:
    sql, params = list_jobs_sql(tenant, statuses, limit)
    return [job_from_row(row) for row in conn.execute(sql, params)]


def job_counts(conn: Connection, tenant: str | None) -> dict[str, int]:
    counts = dict.fromkeys(JOB_STATUSES, 0)
    counts.update(dict(conn.execute(*job_counts_sql(tenant)).fetchall()))
    return counts


def get_job(conn: Connection, tenant: str, job_id: str) -> Job | None:
    row = conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND tenant = ? AND draft = false",
        (job_id, tenant),
    ).fetchone()
    return job_from_row(row) if row else None


def _get(conn: Connection, job_id: str) -> Job:
    row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise NotFound(f"no job {job_id!r}")
    return job_from_row(row)


def _owned(conn: Connection, job_id: str, owner: str) -> Job:
    job = _get(conn, job_id)
    if job.status != "leased" or job.lease_owner != owner:
        raise InvalidInput(f"job {job_id} is not leased by {owner} (lease lost)")
    return job
