"""BM25 with each tenant's own document frequencies, on top of one shared FTS5 index.

FTS5's `bm25()` weighs a term by how many rows of the whole index contain it, so one
tenant's memories would change another tenant's ranking (a flood of "alpha" elsewhere
makes "alpha" worthless here). A single-term match isolates the part of the score that
belongs to one document: FTS5 scores it `-idf_index(t) * tf_part(t, d)`, and the index's
IDF is known (its row count from the index's averages record, the term's row count from
fts5vocab), so `tf_part` is recovered exactly and re-weighed with the IDF counted over
the tenant's active memories in the read spaces. With one tenant and one space the
result equals FTS5's own score (a test pins that). A query left with one term keeps
FTS5's scores as they are: a factor common to every match changes no ranking, and
recall's fusion is scale-free.

Left shared: the length normalisation's average document length (the whole index's),
and which terms are too common to score at all (`choose_terms`' cost budget).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from memory_core.sqlite.db import Connection

SCOPE_COUNT_TTL_S = 5.0  # how long a tenant's document count may be reused
_MIN_IDF = 1e-6  # FTS5 clamps a non-positive IDF to this


def idf(rows: int, hits: int) -> float:
    """FTS5's BM25 IDF, with its clamp."""
    value = math.log((rows - hits + 0.5) / (hits + 0.5)) if rows > 0 else 0.0
    return value if value > 0.0 else _MIN_IDF


def _varint(blob: bytes, at: int = 0) -> tuple[int, int]:
    """SQLite's varint (big-endian 7-bit groups; a 9th byte holds 8 bits)."""
    value = 0
    for i in range(9):
        byte = blob[at + i]
        if i == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    raise ValueError("bad varint")  # pragma: no cover - the loop always returns


def index_rows(conn: Connection) -> int:
    """How many rows the FTS5 index holds: the first varint of its averages record."""
    row = conn.execute("SELECT block FROM memory_fts_data WHERE id = 1").fetchone()
    return _varint(bytes(row[0]))[0] if row and row[0] else 0


class ScopeCounts:
    """A tenant's number of active memories per set of read spaces, reused briefly."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, tuple[str, ...]], tuple[float, int]] = {}

    def count(self, conn: Connection, tenant: str, spaces: Sequence[str]) -> int:
        key = (tenant, tuple(sorted(spaces)))
        now = time.monotonic()
        cached = self._counts.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        marks = ",".join("?" * len(key[1]))
        (count,) = conn.execute(
            "SELECT count(*) FROM memories WHERE tenant = ? AND status = 'active'"
            f" AND space IN ({marks})",
            [tenant, *key[1]],
        ).fetchone()
        if len(self._counts) > 10_000:
            self._counts.clear()
        self._counts[key] = (now + SCOPE_COUNT_TTL_S, count)
        return count


def scored_hits(
    conn: Connection,
    tenant: str,
    spaces: Sequence[str],
    terms: Sequence[tuple[str, int]],
    k: int,
    counts: ScopeCounts,
) -> list[tuple[int, float]]:
    """The k best (rowid, score) of the tenant's active memories in `spaces` for the
    terms (each with its row count in the whole index), lower score is better as with
    FTS5's `bm25()`."""
    marks = ",".join("?" * len(spaces))
    sql = (
        "WITH hits AS MATERIALIZED (SELECT rowid, bm25(memory_fts) AS s FROM memory_fts"
        " WHERE memory_fts MATCH ?)"
        " SELECT hits.rowid, hits.s FROM hits CROSS JOIN memories m ON m.rowid = hits.rowid"
        f" WHERE m.tenant = ? AND m.status = 'active' AND m.space IN ({marks})"
    )
    if len(terms) == 1:
        # One term: its weight would be the same for every match, and recall's fusion is
        # scale-free (min-max, confidence as a ratio), so FTS5's own scores rank exactly
        # as the tenant's would; SQLite ranks, and only k rows come back to Python.
        ((term, _),) = terms
        return conn.execute(
            sql + " ORDER BY hits.s LIMIT ?", [f'"{term}"', tenant, *spaces, k]
        ).fetchall()
    rows = index_rows(conn)
    scope_rows = counts.count(conn, tenant, spaces)
    totals: dict[int, float] = defaultdict(float)
    for term, index_hits in terms:
        matches: list[Any] = conn.execute(sql, [f'"{term}"', tenant, *spaces]).fetchall()
        if not matches:
            continue
        # the count may be up to SCOPE_COUNT_TTL_S old: never fewer rows than matches
        weight = idf(max(scope_rows, len(matches)), len(matches)) / idf(rows, index_hits)
        for rowid, score in matches:
            totals[rowid] += score * weight  # score = -idf_index * tf_part
    return sorted(totals.items(), key=lambda item: item[1])[:k]
