"""Standing rules on Postgres: their candidates in one guarded statement.

See memory_core/standing_rules.py for what standing rules are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memory_core.recall import RecallQuery
from memory_core.rows import MEMORY_COLUMNS, MEMORY_FIELDS, memory_from_row
from memory_core.standing_rules import STANDING_KINDS, Candidates


async def standing_candidates(
    store: Any, query: RecallQuery, vector: np.ndarray, k: int, now: float
) -> Candidates:
    """The scope (the guard) first, materialised, then ranked exactly, so the HNSW
    index (approximate, filtered after the fact) is never used for it."""
    sql = (
        f"WITH r AS MATERIALIZED (SELECT {MEMORY_COLUMNS}, embedding FROM memories"
        " WHERE tenant = %(tenant)s AND status = 'active' AND space = ANY(%(spaces)s)"
        " AND kind = ANY(%(kinds)s) AND (expires_at IS NULL OR expires_at > %(now)s))"
        f" SELECT {MEMORY_COLUMNS}, 1 - (embedding <=> %(vector)s) AS similarity,"
        " count(*) OVER () FROM r ORDER BY embedding <=> %(vector)s LIMIT %(k)s"
    )
    params = {
        "tenant": query.tenant,
        "spaces": list(query.spaces),
        "kinds": list(STANDING_KINDS),
        "now": now,
        "vector": np.asarray(vector, np.float32),
        "k": k,
    }
    rows = await store.fetch(sql, params)
    end = len(MEMORY_FIELDS)
    rules = [(memory_from_row(row[:end]), float(row[end])) for row in rows]
    return Candidates(rules, int(rows[0][end + 1]) if rows else 0)
