"""Integrity checks of a memory database: each finding names what is wrong."""

from __future__ import annotations

from dataclasses import dataclass

from memory_core.sqlite.db import Connection


@dataclass
class Finding:
    check: str
    memory_id: str | None
    detail: str

    def as_dict(self) -> dict[str, str | None]:
        return {"check": self.check, "memory_id": self.memory_id, "detail": self.detail}


SQLITE_CHECKS: list[tuple[str, str, str]] = [
    (
        "active_without_vector",
        "SELECT m.id FROM memories m WHERE m.status = 'active'"
        " AND NOT EXISTS (SELECT 1 FROM memory_vec v WHERE v.rowid = m.rowid)",
        "an active memory has no vector, so KNN cannot find it",
    ),
    (
        "active_without_text",
        "SELECT m.id FROM memories m WHERE m.status = 'active'"
        " AND NOT EXISTS (SELECT 1 FROM memory_fts f WHERE f.rowid = m.rowid)",
        "an active memory has no full-text row",
    ),
    (
        "vector_without_active_memory",
        "SELECT coalesce(m.id, 'rowid ' || v.rowid) FROM memory_vec v"
        " LEFT JOIN memories m ON m.rowid = v.rowid WHERE m.rowid IS NULL OR m.status != 'active'",
        "a vector belongs to no active memory",
    ),
    (
        "text_without_active_memory",
        "SELECT coalesce(m.id, 'rowid ' || f.rowid) FROM memory_fts f"
        " LEFT JOIN memories m ON m.rowid = f.rowid WHERE m.rowid IS NULL OR m.status != 'active'",
        "a full-text row belongs to no active memory",
    ),
    (
        "vector_scope_mismatch",
        "SELECT m.id FROM memory_vec v JOIN memories m ON m.rowid = v.rowid"
        " WHERE v.tenant != m.tenant OR v.space != m.space",
        "a vector is filed under another tenant or space than its memory",
    ),
    (
        "active_without_postings",
        "SELECT m.id FROM memories m WHERE m.status = 'active'"
        " AND NOT EXISTS (SELECT 1 FROM text_docs d WHERE d.doc = m.rowid)",
        "an active memory is missing from its scope's full-text postings and statistics",
    ),
    (
        "postings_without_active_memory",
        "SELECT coalesce(m.id, 'rowid ' || d.doc) FROM text_docs d"
        " JOIN text_scopes s ON s.id = d.scope LEFT JOIN memories m ON m.rowid = d.doc"
        " WHERE m.rowid IS NULL OR m.status != 'active' OR m.tenant != s.tenant"
        " OR m.space != s.space",
        "full-text postings belong to no active memory of their tenant and space",
    ),
]

# Postgres keeps vectors and text vectors in the row; a CHECK constraint already refuses
# them on inactive rows, so only the missing ones need looking for.
POSTGRES_CHECKS: list[tuple[str, str, str]] = [
    (
        "active_without_vector",
        "SELECT id FROM memories WHERE status = 'active' AND embedding IS NULL",
        "an active memory has no vector, so KNN cannot find it",
    ),
    (
        "active_without_text",
        "SELECT id FROM memories WHERE status = 'active' AND tsv IS NULL",
        "an active memory has no full-text vector",
    ),
]

COMMON_CHECKS: list[tuple[str, str, str]] = [
    (
        "superseded_chain_broken",
        "SELECT m.id FROM memories m WHERE m.status = 'superseded' AND (m.superseded_by IS NULL"
        " OR NOT EXISTS (SELECT 1 FROM memories n"
        " WHERE n.id = m.superseded_by AND n.tenant = m.tenant))",
        "a superseded memory points at no memory of its tenant",
    ),
    (
        "forgotten_with_content",
        "SELECT id FROM memories WHERE status = 'forgotten' AND (content IS NOT NULL"
        " OR subject IS NOT NULL OR attribute IS NOT NULL OR value IS NOT NULL"
        " OR content_hash IS NOT NULL OR provenance != '[]' OR entities != '[]')",
        "a forgotten memory still holds content",
    ),
    (
        "event_without_memory",
        "SELECT DISTINCT e.memory_id FROM events e"
        " WHERE NOT EXISTS (SELECT 1 FROM memories m"
        " WHERE m.id = e.memory_id AND m.tenant = e.tenant)",
        "events refer to a memory that does not exist in their tenant",
    ),
    (
        "memory_without_events",
        "SELECT m.id FROM memories m"
        " WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.memory_id = m.id)",
        "a memory has no event explaining how it came to be",
    ),
]


def lint(conn: Connection, limit: int = 1000) -> list[Finding]:
    findings: list[Finding] = []
    for name, sql, detail in SQLITE_CHECKS + COMMON_CHECKS:
        for (memory_id,) in conn.execute(sql + f" LIMIT {int(limit)}"):
            findings.append(Finding(name, memory_id, detail))
    return findings
