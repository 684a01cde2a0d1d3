"""Mapping between SQLite rows and Memory / Event objects, and appending events."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from memory_core.model import Event, Memory
from memory_core.sqlite.db import Connection

MEMORY_COLUMNS = (
    "id, tenant, space, kind, content, subject, attribute, value, confidence, source, "
    "provenance, status, superseded_by, status_reason, created_at, updated_at, expires_at, "
    "content_hash, entities, observed_at"
)
EVENT_COLUMNS = "seq, event_id, memory_id, tenant, space, action, actor, reason, at, detail"
MEMORY_FIELDS = [name.strip() for name in MEMORY_COLUMNS.split(",")]
JSON_FIELDS = ("provenance", "entities")
INSERT_EVENT_COLUMNS = "event_id, memory_id, tenant, space, action, actor, reason, at, detail"


def memory_values(memory: Memory, encode: Callable[[Any], Any]) -> tuple[Any, ...]:
    """`memory` as a row in MEMORY_COLUMNS order; `encode` turns lists into the
    backend's JSON (text for SQLite, jsonb for Postgres)."""
    return tuple(
        encode(getattr(memory, name)) if name in JSON_FIELDS else getattr(memory, name)
        for name in MEMORY_FIELDS
    )


def event_values(
    memory: Memory,
    action: str,
    actor: str,
    reason: str | None,
    detail: dict[str, Any] | None,
    at: float | None,
    event_id: str | None,
    encode: Callable[[Any], Any],
) -> tuple[Any, ...]:
    """An event row in INSERT_EVENT_COLUMNS order (a fresh id and the time by default)."""
    return (
        event_id or uuid.uuid4().hex,
        memory.id,
        memory.tenant,
        memory.space,
        action,
        actor,
        reason,
        at if at is not None else time.time(),
        encode(json.loads(json.dumps(detail or {}, sort_keys=True))),
    )


def _json(value: Any, empty: str) -> Any:
    """SQLite hands back JSON as text; Postgres jsonb arrives already decoded."""
    return json.loads(value or empty) if value is None or isinstance(value, str) else value


def memory_from_row(row: tuple[Any, ...]) -> Memory:
    values = list(row)
    values[10] = _json(values[10], "[]")
    values[18] = _json(values[18], "[]")
    return Memory(*values)


def event_from_row(row: tuple[Any, ...]) -> Event:
    values = list(row)
    values[9] = _json(values[9], "{}")
    return Event(*values)


def append_event(
    conn: Connection,
    memory: Memory,
    action: str,
    actor: str,
    reason: str | None = None,
    detail: dict[str, Any] | None = None,
    at: float | None = None,
    event_id: str | None = None,
) -> None:
    """Record a state change; called inside the transaction that makes the change."""
    conn.execute(
        f"INSERT OR IGNORE INTO events ({INSERT_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        event_values(memory, action, actor, reason, detail, at, event_id, _dumps),
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def fetch_memory(conn: Connection, tenant: str, memory_id: str) -> tuple[int, Memory] | None:
    row = conn.execute(
        f"SELECT rowid, {MEMORY_COLUMNS} FROM memories WHERE tenant = ? AND id = ?",
        (tenant, memory_id),
    ).fetchone()
    if row is None:
        return None
    return row[0], memory_from_row(row[1:])
