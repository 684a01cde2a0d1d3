"""State changes of memories in Postgres, each run inside the caller's transaction.

The same rules as `lifecycle` (shared: `build_memory`, `reinforced`, transitions); rows
being changed are locked (`FOR UPDATE`) so replicas changing one memory at once
serialise instead of losing an update. Leaving `active` clears the embedding and the
text-search vector in the same UPDATE, so recall's indexes cannot reach the row.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from psycopg import AsyncConnection
from psycopg.errors import UniqueViolation
from psycopg.types.json import Jsonb

from memory_core.errors import InvalidInput, NotFound
from memory_core.lifecycle import (
    CHAIN_FORGET_REASON,
    build_memory,
    cross_space,
    reinforce_detail,
    reinforced,
)
from memory_core.model import Memory, NewMemory, check_transition
from memory_core.recall import fold
from memory_core.rows import (
    INSERT_EVENT_COLUMNS,
    MEMORY_COLUMNS,
    MEMORY_FIELDS,
    event_values,
    memory_from_row,
    memory_values,
)

TEXT_CONFIG = "english"


async def insert_memory(
    conn: AsyncConnection,
    tenant: str,
    space: str,
    new: NewMemory,
    vector: np.ndarray | None,
    actor: str,
    *,
    record_event: bool = True,
    **options: Any,
) -> Memory:
    """Insert one memory; an active one gets its embedding and text-search vector."""
    memory = build_memory(tenant, space, new, **options)
    active = memory.status == "active"
    if active and vector is None:
        raise InvalidInput("an active memory needs an embedding")
    try:
        async with conn.transaction():  # a savepoint: a duplicate id leaves the rest intact
            await conn.execute(
                f"INSERT INTO memories ({MEMORY_COLUMNS}, embedding, tsv)"
                f" VALUES ({', '.join(['%s'] * len(MEMORY_FIELDS))}, %s,"
                f" CASE WHEN %s THEN to_tsvector('{TEXT_CONFIG}', %s) END)",
                (
                    *memory_values(memory, Jsonb),
                    np.asarray(vector, np.float32) if active else None,
                    active,
                    fold(memory.content or "") if active else None,
                ),
            )
    except UniqueViolation as exc:
        raise InvalidInput(f"a memory with id {memory.id} already exists") from exc
    if record_event:
        await append_event(
            conn, memory, "added", actor, detail={"kind": memory.kind, "source": memory.source}
        )
    return memory


async def append_event(
    conn: AsyncConnection,
    memory: Memory,
    action: str,
    actor: str,
    reason: str | None = None,
    detail: dict[str, Any] | None = None,
    at: float | None = None,
    event_id: str | None = None,
) -> None:
    """Record a state change; called inside the transaction that makes the change."""
    await conn.execute(
        f"INSERT INTO events ({INSERT_EVENT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s,"
        " %s) ON CONFLICT (event_id) DO NOTHING",
        event_values(memory, action, actor, reason, detail, at, event_id, Jsonb),
    )


async def fetch(
    conn: AsyncConnection, tenant: str, memory_id: str, *, lock: bool = False
) -> Memory | None:
    cursor = await conn.execute(
        f"SELECT {MEMORY_COLUMNS} FROM memories WHERE tenant = %s AND id = %s"
        + (" FOR UPDATE" if lock else ""),
        (tenant, memory_id),
    )
    row = await cursor.fetchone()
    return memory_from_row(row) if row else None


async def require(conn: AsyncConnection, tenant: str, memory_id: str) -> Memory:
    """The memory, locked for the rest of the transaction."""
    memory = await fetch(conn, tenant, memory_id, lock=True)
    if memory is None:
        raise NotFound(f"no memory {memory_id!r} in tenant {tenant!r}")
    return memory


async def mark_superseded(
    conn: AsyncConnection, tenant: str, old_id: str, new: Memory, reason: str, actor: str
) -> Memory:
    old = await require(conn, tenant, old_id)
    check_transition(old.status, "superseded")
    if old.id == new.id:
        raise InvalidInput("a memory cannot supersede itself")
    now = time.time()
    await conn.execute(
        "UPDATE memories SET status = 'superseded', superseded_by = %s, status_reason = %s,"
        " updated_at = %s, embedding = NULL, tsv = NULL WHERE tenant = %s AND id = %s",
        (new.id, reason, now, tenant, old_id),
    )
    old_detail, new_detail = cross_space(old, new)
    await append_event(conn, old, "superseded", actor, reason, old_detail, at=now)
    await append_event(conn, new, "supersedes", actor, reason, new_detail, at=now)
    return await require(conn, tenant, old_id)


async def reinforce(
    conn: AsyncConnection,
    tenant: str,
    memory_id: str,
    provenance: dict[str, Any] | None,
    actor: str,
) -> Memory:
    memory = await require(conn, tenant, memory_id)
    confidence, trail, source = reinforced(memory, provenance)
    now = time.time()
    await conn.execute(
        "UPDATE memories SET confidence = %s, provenance = %s, source = %s, updated_at = %s"
        " WHERE tenant = %s AND id = %s",
        (confidence, Jsonb(trail), source, now, tenant, memory_id),
    )
    await append_event(
        conn,
        memory,
        "reinforced",
        actor,
        detail=reinforce_detail(memory, confidence, source),
        at=now,
    )
    return await require(conn, tenant, memory_id)


async def retire(
    conn: AsyncConnection, tenant: str, memory_id: str, reason: str, actor: str
) -> Memory:
    """An active memory that is no longer true, with nothing replacing it: `expired`."""
    memory = await require(conn, tenant, memory_id)
    check_transition(memory.status, "expired")
    now = time.time()
    await conn.execute(
        "UPDATE memories SET status = 'expired', status_reason = %s, updated_at = %s,"
        " embedding = NULL, tsv = NULL WHERE tenant = %s AND id = %s",
        (reason, now, tenant, memory_id),
    )
    await append_event(conn, memory, "expired", actor, reason, at=now)
    return await require(conn, tenant, memory_id)


async def predecessors(conn: AsyncConnection, tenant: str, memory_id: str) -> list[str]:
    """Ids of every memory this one superseded, directly or through others."""
    cursor = await conn.execute(
        "WITH RECURSIVE chain(id) AS (SELECT id FROM memories WHERE tenant = %s"
        " AND superseded_by = %s UNION SELECT m.id FROM memories m JOIN chain c"
        " ON m.superseded_by = c.id WHERE m.tenant = %s) SELECT id FROM chain",
        (tenant, memory_id, tenant),
    )
    return [row[0] for row in await cursor.fetchall() if row[0] != memory_id]


async def forget(
    conn: AsyncConnection, tenant: str, memory_id: str, reason: str, actor: str
) -> Memory:
    """Erase content, slot, hash, provenance, entities, embedding and text vector, of
    this memory and of its predecessors (the versions it superseded)."""
    forgotten = await _forget_one(conn, tenant, memory_id, reason, actor, {})
    for old_id in await predecessors(conn, tenant, memory_id):
        old = await require(conn, tenant, old_id)
        if old.status != "forgotten":
            await _forget_one(conn, tenant, old_id, CHAIN_FORGET_REASON, actor, {"with": memory_id})
    return forgotten


async def _forget_one(
    conn: AsyncConnection,
    tenant: str,
    memory_id: str,
    reason: str,
    actor: str,
    extra: dict[str, Any],
) -> Memory:
    memory = await require(conn, tenant, memory_id)
    check_transition(memory.status, "forgotten")
    now = time.time()
    await conn.execute(
        "UPDATE memories SET content = NULL, subject = NULL, attribute = NULL, value = NULL,"
        " content_hash = NULL, provenance = '[]', entities = '[]', confidence = 0,"
        " embedding = NULL, tsv = NULL, status = 'forgotten', status_reason = %s,"
        " updated_at = %s WHERE tenant = %s AND id = %s",
        (reason, now, tenant, memory_id),
    )
    detail = {"from": memory.status, **extra}
    await append_event(conn, memory, "forgotten", actor, reason, detail, at=now)
    return await require(conn, tenant, memory_id)


async def expire_due(conn: AsyncConnection, now: float, actor: str) -> list[Memory]:
    cursor = await conn.execute(
        f"SELECT {MEMORY_COLUMNS} FROM memories WHERE status = 'active'"
        " AND expires_at IS NOT NULL AND expires_at <= %s FOR UPDATE SKIP LOCKED",
        (now,),
    )
    expired = [memory_from_row(row) for row in await cursor.fetchall()]
    for memory in expired:
        await conn.execute(
            "UPDATE memories SET status = 'expired', status_reason = 'expires_at passed',"
            " updated_at = %s, embedding = NULL, tsv = NULL WHERE tenant = %s AND id = %s",
            (now, memory.tenant, memory.id),
        )
        await append_event(conn, memory, "expired", actor, "expires_at passed", at=now)
    return expired
