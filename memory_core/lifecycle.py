"""State changes of memories, as functions run on the writer's connection.

Each function runs inside one transaction together with its event, so the ledger and
the data never disagree. Only active memories keep rows in the vector and text indexes.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from memory_core.errors import InvalidInput, NotFound
from memory_core.model import (
    Memory,
    NewMemory,
    check_transition,
    content_hash,
    new_memory_id,
)
from memory_core.rows import (
    MEMORY_COLUMNS,
    MEMORY_FIELDS,
    append_event,
    fetch_memory,
    memory_values,
)
from memory_core.sqlite import text_index
from memory_core.sqlite.db import Connection, IntegrityError


def build_memory(
    tenant: str,
    space: str,
    new: NewMemory,
    *,
    memory_id: str | None = None,
    status: str = "active",
    created_at: float | None = None,
    updated_at: float | None = None,
    extra: dict[str, Any] | None = None,
    provenance: list[dict[str, Any]] | None = None,
) -> Memory:
    """The row a new memory becomes (shared by both backends); forgotten ones hold no text."""
    now = time.time()
    extra = extra or {}
    kept = status != "forgotten"
    return Memory(
        id=memory_id or new_memory_id(),
        tenant=tenant,
        space=space,
        kind=new.kind,
        content=new.content if kept else None,
        subject=new.subject if kept else None,
        attribute=new.attribute if kept else None,
        value=new.value if kept else None,
        confidence=new.confidence,
        source=new.source,
        provenance=provenance
        if provenance is not None
        else ([new.provenance] if new.provenance else []),
        status=status,
        superseded_by=extra.get("superseded_by"),
        status_reason=extra.get("status_reason"),
        created_at=created_at if created_at is not None else now,
        updated_at=updated_at if updated_at is not None else now,
        expires_at=new.expires_at,
        content_hash=content_hash(tenant, space, new.content) if kept else None,
        entities=new.entities if kept else [],
        observed_at=new.observed_at,
    )


def reinforced(
    memory: Memory, provenance: dict[str, Any] | None
) -> tuple[float, list[dict[str, Any]], str]:
    """Confidence moved a fifth of the way to 1, the provenance trail (last 50 kept), and
    the source: a memory only the assistant stated becomes the user's once the user
    states or confirms it (provenance `stated_by: user`)."""
    if memory.status != "active":
        raise InvalidInput(f"only active memories can be reinforced (this one is {memory.status})")
    confidence = min(1.0, memory.confidence + (1.0 - memory.confidence) * 0.2)
    trail = memory.provenance + ([provenance] if provenance else [])
    source = memory.source
    if source == "assistant" and (provenance or {}).get("stated_by") == "user":
        source = "user"
    return confidence, trail[-50:], source


def reinforce_detail(memory: Memory, confidence: float, source: str) -> dict[str, Any]:
    detail: dict[str, Any] = {"confidence_before": memory.confidence, "confidence": confidence}
    if source != memory.source:
        detail.update(source_before=memory.source, source=source)
    return detail


def cross_space(old: Memory, new: Memory) -> tuple[dict[str, Any], dict[str, Any]]:
    """Event details of a supersession; across spaces each names the other's space."""
    old_detail: dict[str, Any] = {"superseded_by": new.id}
    new_detail: dict[str, Any] = {"supersedes": old.id}
    if old.space != new.space:
        old_detail["successor_space"] = new.space
        new_detail["predecessor_space"] = old.space
    return old_detail, new_detail


# Forgetting a memory erases its predecessors too: every memory it superseded, and theirs.
CHAIN_FORGET_REASON = "forgotten with the memory that superseded it"


def insert_memory(
    conn: Connection,
    tenant: str,
    space: str,
    new: NewMemory,
    vector: np.ndarray | None,
    actor: str,
    *,
    memory_id: str | None = None,
    status: str = "active",
    created_at: float | None = None,
    updated_at: float | None = None,
    extra: dict[str, Any] | None = None,
    provenance: list[dict[str, Any]] | None = None,
    record_event: bool = True,
) -> Memory:
    """Insert one memory (and, when active, its vector and text rows)."""
    memory = build_memory(
        tenant,
        space,
        new,
        memory_id=memory_id,
        status=status,
        created_at=created_at,
        updated_at=updated_at,
        extra=extra,
        provenance=provenance,
    )
    try:
        cursor = conn.execute(
            f"INSERT INTO memories ({MEMORY_COLUMNS})"
            f" VALUES ({', '.join('?' * len(MEMORY_FIELDS))})",
            memory_values(memory, json.dumps),
        )
    except IntegrityError as exc:
        raise InvalidInput(f"a memory with id {memory.id} already exists") from exc
    rowid = cursor.lastrowid
    if status == "active":
        if vector is None:
            raise InvalidInput("an active memory needs an embedding")
        _index(conn, rowid, memory, vector)
    if record_event:
        append_event(
            conn, memory, "added", actor, detail={"kind": memory.kind, "source": memory.source}
        )
    return memory


def _index(conn: Connection, rowid: int, memory: Memory, vector: np.ndarray) -> None:
    conn.execute(
        "INSERT INTO memory_vec (rowid, tenant, space, kind, embedding) VALUES (?, ?, ?, ?, ?)",
        (rowid, memory.tenant, memory.space, memory.kind, np.asarray(vector, np.float32).tobytes()),
    )
    conn.execute("INSERT INTO memory_fts (rowid, content) VALUES (?, ?)", (rowid, memory.content))
    text_index.index_doc(conn, rowid, memory.tenant, memory.space, memory.content)


def _unindex(conn: Connection, rowid: int) -> None:
    conn.execute("DELETE FROM memory_vec WHERE rowid = ?", (rowid,))
    conn.execute("DELETE FROM memory_fts WHERE rowid = ?", (rowid,))
    text_index.unindex_doc(conn, rowid)


def require(conn: Connection, tenant: str, memory_id: str) -> tuple[int, Memory]:
    found = fetch_memory(conn, tenant, memory_id)
    if found is None:
        raise NotFound(f"no memory {memory_id!r} in tenant {tenant!r}")
    return found


def mark_superseded(
    conn: Connection, tenant: str, old_id: str, new: Memory, reason: str, actor: str
) -> Memory:
    rowid, old = require(conn, tenant, old_id)
    check_transition(old.status, "superseded")
    if old.id == new.id:
        raise InvalidInput("a memory cannot supersede itself")
    now = time.time()
    conn.execute(
        "UPDATE memories SET status = 'superseded', superseded_by = ?, status_reason = ?,"
        " updated_at = ? WHERE rowid = ?",
        (new.id, reason, now, rowid),
    )
    _unindex(conn, rowid)
    old_detail, new_detail = cross_space(old, new)
    append_event(conn, old, "superseded", actor, reason, old_detail, at=now)
    append_event(conn, new, "supersedes", actor, reason, new_detail, at=now)
    return require(conn, tenant, old_id)[1]


def reinforce(
    conn: Connection, tenant: str, memory_id: str, provenance: dict[str, Any] | None, actor: str
) -> Memory:
    """Raise confidence towards 1 and append provenance; no new row."""
    rowid, memory = require(conn, tenant, memory_id)
    confidence, trail, source = reinforced(memory, provenance)
    now = time.time()
    conn.execute(
        "UPDATE memories SET confidence = ?, provenance = ?, source = ?, updated_at = ?"
        " WHERE rowid = ?",
        (confidence, json.dumps(trail), source, now, rowid),
    )
    append_event(
        conn,
        memory,
        "reinforced",
        actor,
        detail=reinforce_detail(memory, confidence, source),
        at=now,
    )
    return require(conn, tenant, memory_id)[1]


def retire(conn: Connection, tenant: str, memory_id: str, reason: str, actor: str) -> Memory:
    """An active memory that is no longer true, with nothing replacing it: `expired`."""
    rowid, memory = require(conn, tenant, memory_id)
    check_transition(memory.status, "expired")
    now = time.time()
    conn.execute(
        "UPDATE memories SET status = 'expired', status_reason = ?, updated_at = ? WHERE rowid = ?",
        (reason, now, rowid),
    )
    _unindex(conn, rowid)
    append_event(conn, memory, "expired", actor, reason, at=now)
    return require(conn, tenant, memory_id)[1]


def predecessors(conn: Connection, tenant: str, memory_id: str) -> list[str]:
    """Ids of every memory this one superseded, directly or through others."""
    rows = conn.execute(
        "WITH RECURSIVE chain(id) AS (SELECT id FROM memories WHERE tenant = ?"
        " AND superseded_by = ? UNION SELECT m.id FROM memories m JOIN chain c"
        " ON m.superseded_by = c.id WHERE m.tenant = ?) SELECT id FROM chain",
        (tenant, memory_id, tenant),
    ).fetchall()
    return [row[0] for row in rows if row[0] != memory_id]


def forget(conn: Connection, tenant: str, memory_id: str, reason: str, actor: str) -> Memory:
    """Erase content, slot, hash, provenance, entities, vector and text; keep the tombstone.

    Its predecessors (what it superseded) are erased too: they hold earlier versions
    of the same thing."""
    forgotten = _forget_one(conn, tenant, memory_id, reason, actor, {})
    for old_id in predecessors(conn, tenant, memory_id):
        _, old = require(conn, tenant, old_id)
        if old.status != "forgotten":
            _forget_one(conn, tenant, old_id, CHAIN_FORGET_REASON, actor, {"with": memory_id})
    return forgotten


def _forget_one(
    conn: Connection, tenant: str, memory_id: str, reason: str, actor: str, extra: dict[str, Any]
) -> Memory:
    rowid, memory = require(conn, tenant, memory_id)
    check_transition(memory.status, "forgotten")
    now = time.time()
    _unindex(conn, rowid)
    conn.execute(
        "UPDATE memories SET content = NULL, subject = NULL, attribute = NULL, value = NULL,"
        " content_hash = NULL, provenance = '[]', entities = '[]', confidence = 0,"
        " status = 'forgotten', status_reason = ?, updated_at = ? WHERE rowid = ?",
        (reason, now, rowid),
    )
    detail = {"from": memory.status, **extra}
    append_event(conn, memory, "forgotten", actor, reason, detail, at=now)
    return require(conn, tenant, memory_id)[1]


def expire_due(conn: Connection, now: float, actor: str) -> list[Memory]:
    rows = conn.execute(
        "SELECT tenant, id FROM memories WHERE status = 'active' AND expires_at IS NOT NULL"
        " AND expires_at <= ?",
        (now,),
    ).fetchall()
    expired = []
    for tenant, memory_id in rows:
        rowid, memory = require(conn, tenant, memory_id)
        check_transition(memory.status, "expired")
        conn.execute(
            "UPDATE memories SET status = 'expired', status_reason = 'expires_at passed',"
            " updated_at = ? WHERE rowid = ?",
            (now, rowid),
        )
        _unindex(conn, rowid)
        append_event(conn, memory, "expired", actor, "expires_at passed", at=now)
        expired.append(memory)
    return expired
