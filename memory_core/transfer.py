"""Export and import as JSONL: one memory per line, with its whole event history."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from memory_core import lifecycle
from memory_core.errors import InvalidInput
from memory_core.long_text import MAX_LONG_CHARS, is_long, long_source, split_text
from memory_core.model import STATUSES, Event, Memory, NewMemory, validate_id
from memory_core.rows import (
    EVENT_COLUMNS,
    MEMORY_COLUMNS,
    append_event,
    event_from_row,
    memory_from_row,
)
from memory_core.sqlite.db import Connection
from memory_core.store import ImportResult

FORMAT = "memrelay.memory.v1"


def export_batch(
    conn: Connection, tenant: str, after_rowid: int, size: int
) -> tuple[list[str], int]:
    rows = conn.execute(
        f"SELECT rowid, {MEMORY_COLUMNS} FROM memories WHERE tenant = ? AND rowid > ?"
        " ORDER BY rowid LIMIT ?",
        (tenant, after_rowid, size),
    ).fetchall()
    lines = []
    for row in rows:
        memory = memory_from_row(row[1:])
        events = conn.execute(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE tenant = ? AND memory_id = ? ORDER BY seq",
            (tenant, memory.id),
        ).fetchall()
        lines.append(export_line(memory, [event_from_row(e) for e in events]))
    return lines, (rows[-1][0] if rows else after_rowid)


def export_line(memory: Memory, events: list[Event]) -> str:
    """One JSONL record: the memory and its history (ledger fields local to a database dropped)."""
    record = {"format": FORMAT, **memory.as_dict()}
    record.pop("severity")
    record["events"] = [
        {k: v for k, v in event.as_dict().items() if k not in ("seq", "tenant")} for event in events
    ]
    return json.dumps(record, ensure_ascii=False, sort_keys=True)


def parse_line(line: str, number: int, result: ImportResult) -> dict[str, Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        record = json.loads(line)
    except ValueError as exc:
        result.errors.append(f"line {number}: not JSON ({exc})")
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        result.errors.append(f"line {number}: not a {FORMAT} record")
        return None
    if not isinstance(record.get("id"), str) or record.get("status") not in STATUSES:
        result.errors.append(f"line {number}: missing id or unknown status")
        return None
    return record


def split_long(record: dict[str, Any], number: int, result: ImportResult) -> list[dict[str, Any]]:
    """A record whose content is longer than one memory holds, as one record per part
    (cut as remember cuts it: memory_core/long_text.py), else the record itself.

    Part 1 keeps the record's id (links to it from other records still resolve) and
    its history; part n is `<id>.part<n>` (so importing twice adds nothing). Every part
    carries the `long_source` id, its position and the count in its provenance, and no
    subject/attribute slot (parts of one text are not versions of one fact). Past
    MAX_LONG_CHARS the record is refused with a line error, as the admin API refuses it.
    """
    content = record.get("content")
    if not isinstance(content, str) or not is_long(content):
        return [record]
    if len(content) > MAX_LONG_CHARS:
        result.errors.append(
            f"line {number}: content is longer than {MAX_LONG_CHARS:,} characters"
            " (longer texts are refused, not cut)"
        )
        return []
    parts = split_text(content)
    source = long_source(content)
    provenance = record.get("provenance")
    provenance = list(provenance) if isinstance(provenance, list) else []
    out = []
    for position, part in enumerate(parts, start=1):
        piece = {
            **record,
            "content": part,
            "subject": None,
            "attribute": None,
            "value": None,
            "provenance": [
                *provenance,
                {"long_source": source, "part": position, "parts": len(parts)},
            ],
        }
        if position > 1:
            piece["id"] = f"{record['id']}.part{position}"
            piece["events"] = []  # event ids are unique: the history stays with part 1
        out.append(piece)
    return out


def import_records(
    conn: Connection,
    tenant: str,
    batch: list[tuple[int, dict[str, Any]]],
    vectors: np.ndarray,
    result: ImportResult,
) -> None:
    next_vector = 0
    for number, record in batch:
        needs_vector = record["status"] == "active" and bool(record.get("content"))
        vector = vectors[next_vector] if needs_vector else None
        next_vector += int(needs_vector)
        owner = conn.execute("SELECT tenant FROM memories WHERE id = ?", (record["id"],)).fetchone()
        if owner is not None:
            if owner[0] == tenant:
                result.skipped += 1
            else:
                result.errors.append(transfer_conflict(number, record["id"], owner[0], tenant))
            continue
        conn.execute("SAVEPOINT import_one")
        try:
            _insert(conn, tenant, record, vector)
        except (InvalidInput, KeyError, TypeError, ValueError) as exc:
            conn.execute("ROLLBACK TO import_one")
            result.errors.append(f"line {number}: {exc}")
        else:
            result.imported += 1
        conn.execute("RELEASE import_one")


def imported_fields(record: dict[str, Any]) -> tuple[str, NewMemory, dict[str, Any]]:
    """The space, the memory and the keyword arguments of `insert_memory` for one record."""
    content = record.get("content") or ""
    new = NewMemory(
        content=content or "(forgotten)",
        kind=record.get("kind", "fact"),
        subject=record.get("subject"),
        attribute=record.get("attribute"),
        value=record.get("value"),
        confidence=float(record.get("confidence", 0.8)),
        source=record.get("source", "import"),
        expires_at=record.get("expires_at"),
        entities=list(record.get("entities") or []),
        observed_at=record.get("observed_at"),
    ).validated()
    space = validate_id(record.get("space", "default"), "space")
    options = {
        "memory_id": record["id"],
        "status": record["status"],
        "created_at": record.get("created_at"),
        "updated_at": record.get("updated_at"),
        "extra": {
            "superseded_by": record.get("superseded_by"),
            "status_reason": record.get("status_reason"),
        },
        "provenance": list(record.get("provenance") or []),
        "record_event": False,
    }
    return space, new, options


def imported_events(record: dict[str, Any]) -> list[dict[str, Any]]:
    """`append_event` keyword arguments: the record's history, then `imported`."""
    events = record.get("events") or []
    history = [
        {
            "action": event["action"],
            "actor": event.get("actor", "import"),
            "reason": event.get("reason"),
            "detail": event.get("detail") or {},
            "at": event.get("at"),
            "event_id": event.get("event_id"),
        }
        for event in events
    ]
    return [*history, {"action": "imported", "actor": "import", "detail": {"events": len(events)}}]


def _insert(conn: Connection, tenant: str, record: dict[str, Any], vector: Any) -> None:
    space, new, options = imported_fields(record)
    memory = lifecycle.insert_memory(conn, tenant, space, new, vector, "import", **options)
    for event in imported_events(record):
        append_event(conn, memory, **event)


def transfer_conflict(number: int, memory_id: str, owner: str, tenant: str) -> str:
    """Why a record was not imported: its id already lives under another tenant here."""
    return (
        f"line {number}: memory {memory_id} already exists in this database under tenant"
        f" {owner!r}, not {tenant!r}: ids are global, so a tenant's export imports into"
        " another tenant only in another database"
    )
