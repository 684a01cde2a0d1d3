"""Standing rules on SQLite: their candidates, and the guard every one passes.

See memory_core/standing_rules.py for what standing rules are. With the vector cache
the rules are scored in the same scan as the hybrid recall's vector side
(`VectorCache.search_with_kinds`); without it (vec0 KNN mode) the kind filter runs
inside sqlite-vec. Either way `guarded` is the SQL that decides what may be added.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from memory_core.model import Memory
from memory_core.recall import RecallQuery, knn
from memory_core.rows import MEMORY_COLUMNS, memory_from_row
from memory_core.sqlite.db import Connection
from memory_core.sqlite.vector_cache import VectorCache
from memory_core.standing_rules import STANDING_KINDS, Candidates, StandingPolicy, qualifying

KINDS = list(STANDING_KINDS)


def standing_candidates(
    cache: VectorCache | None,
    conn: Connection,
    query: RecallQuery,
    vector: np.ndarray,
    k: int,
    now: float,
    policy: StandingPolicy | None = None,
) -> Candidates:
    """The `k` nearest standing rules of the query's tenant and read spaces, guarded."""
    if cache is None:
        hits = knn(conn, replace(query, kinds=KINDS), vector, k)
        in_scope = count_in_scope(conn, query)
    else:
        _, hits, in_scope = cache.search_with_kinds(
            conn, query.tenant, query.spaces, vector, 0, KINDS, k
        )
    return found(conn, query, hits, in_scope, now, policy)


def found(
    conn: Connection,
    query: RecallQuery,
    hits: list[tuple[int, float]],
    in_scope: int,
    now: float,
    policy: StandingPolicy | None,
) -> Candidates:
    """Candidates from nearest-first `hits`: those `policy` could add, guarded."""
    return Candidates(guarded(conn, query, qualifying(hits, in_scope, policy), now), in_scope)


def count_in_scope(conn: Connection, query: RecallQuery) -> int:
    sql = (
        f"SELECT count(*) FROM memories WHERE tenant = ? AND status = 'active'"
        f" AND kind IN ({_marks(KINDS)}) AND space IN ({_marks(query.spaces)})"
    )
    return int(conn.execute(sql, [query.tenant, *KINDS, *query.spaces]).fetchone()[0])


def guarded(
    conn: Connection, query: RecallQuery, hits: list[tuple[int, float]], now: float
) -> list[tuple[Memory, float]]:
    """The hits that are this tenant's active, unexpired standing rules in a read space,
    nearest first: this SQL is the guard, whatever the candidates' source (looked up by
    rowid: `+tenant` keeps the scope index out, as in memory_core.recall._guard)."""
    if not hits:
        return []
    rowids = [rowid for rowid, _ in hits]
    sql = (
        f"SELECT rowid, {MEMORY_COLUMNS} FROM memories WHERE rowid IN ({_marks(rowids)})"
        f" AND +tenant = ? AND status = 'active' AND space IN ({_marks(query.spaces)})"
        f" AND kind IN ({_marks(KINDS)}) AND (expires_at IS NULL OR expires_at > ?)"
    )
    params: list[Any] = [*rowids, query.tenant, *query.spaces, *KINDS, now]
    rows = {row[0]: memory_from_row(row[1:]) for row in conn.execute(sql, params)}
    return [(rows[rowid], similarity) for rowid, similarity in hits if rowid in rows]


def _marks(values: Any) -> str:
    return ",".join("?" * len(values))
