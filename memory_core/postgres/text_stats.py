"""BM25 on Postgres with each tenant's own statistics, computed in the recall statement.

`ts_rank` reads only the document: a word found in every memory of a tenant weighs as
much as one found in a single memory. This scores the full-text matches as the SQLite
backend does (FTS5's BM25 formula, IDF and clamp, with the k1 and b both backends share
in memory_core/bm25.py), every statistic counted over the tenant's active memories in
the read spaces, so another tenant or an unreadable space never changes the ranking:

- N and the average length: `ScopeStats`, one index-only count per scope, reused for
  SCOPE_STATS_TTL_S (schema step 5 keeps each memory's length in `tsv_length`);
- a term's document frequency: its matches in scope, counted in the statement, since
  every match in scope is scored anyway;
- a term's frequency in a memory: read back from `ts_rank` of that one term (see
  `bm25_ctes`).

Cost: the matches are those of the query's lexemes minus the ones the planner's
statistics show in more than POSTINGS_BUDGET memories (the store's `_common_lexemes`),
so a common word never makes recall read a whole tenant; each match is scored once per
query term it holds, about as fast as `ts_rank` over the whole query was.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from memory_core.bm25 import K1, MIN_IDF, B

SCOPE_STATS_TTL_S = 5.0  # how long a scope's count and average length may be reused


class ScopeStats:
    """A tenant's active memories in a set of read spaces: how many, average length."""

    def __init__(self) -> None:
        self._stats: dict[tuple[str, tuple[str, ...]], tuple[float, int, float]] = {}

    async def get(
        self, conn: AsyncConnection, tenant: str, spaces: Sequence[str]
    ) -> tuple[int, float]:
        key = (tenant, tuple(sorted(spaces)))
        now = time.monotonic()
        cached = self._stats.get(key)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2]
        cursor = await conn.execute(
            "SELECT count(*), coalesce(sum(tsv_length), 0) FROM memories"
            " WHERE tenant = %s AND status = 'active' AND space = ANY(%s)",
            (tenant, list(key[1])),
        )
        count, length = await cursor.fetchone() or (0, 0)
        average = float(length) / count if count else 1.0
        if len(self._stats) > 10_000:
            self._stats.clear()
        self._stats[key] = (now + SCOPE_STATS_TTL_S, int(count), max(average, 1.0))
        return int(count), max(average, 1.0)


def bm25_ctes(scope: str, kinds: str, text_config: str) -> str:
    """CTEs `terms` (the query's lexemes) ... `x` (seq, rank: BM25, higher is better, the
    best %(pool)s), for a statement whose parameters hold `terms`, `common`, `pool` and
    `bm25_params`. `scope` is the tenant / read spaces / active condition the
    statistics are counted over; `kinds` further narrows the ranked candidates only.

    A term's frequency in a memory comes from `ts_rank` of that one term with every
    weight 1 and no normalisation, which is sum(1/j^2, j = 1..tf) / (pi^2/6) (tsrank.c,
    calc_rank_or); the tail of that series is about 1 / (tf + 1/2), so tf is read back
    exactly (a test pins tf = 2). Unnesting each match's tsvector instead cost 4-5x as
    much (building every lexeme's position array). Scores are rounded to 12 decimals so
    that equal scores summed in another order stay equal: ties then go to the older
    memory (lower seq), here and in the store's sort, as FTS5's rowid order does. Each
    term's IDF is computed once (`idf`), not per match."""
    return (
        "terms AS (SELECT lexeme, to_tsquery('simple', quote_literal(lexeme)) AS one"
        f" FROM unnest(to_tsvector('{text_config}', %(terms)s))"
        " WHERE lexeme <> ALL(%(common)s::text[])),"
        " q AS (SELECT to_tsquery('simple', string_agg(quote_literal(lexeme), ' | '))"
        " AS query FROM terms),"
        " hits AS MATERIALIZED (SELECT seq, kind, tsv, tsv_length FROM memories, q"
        f" WHERE tsv @@ q.query AND {scope}),"
        " tf AS MATERIALIZED (SELECT h.seq, h.kind, h.tsv_length AS dl, t.lexeme,"
        " greatest(round(1 / greatest(1.6449340668482264"
        " * (1 - ts_rank('{1,1,1,1}', h.tsv, t.one, 0)::float8), 1e-9) - 0.5), 1) AS tf"
        " FROM hits h, terms t WHERE h.tsv @@ t.one),"
        " idf AS (SELECT lexeme, greatest(ln((greatest(%(docs)s::float8, count(*))"
        f" - count(*) + 0.5) / (count(*) + 0.5)), {MIN_IDF}) AS idf FROM tf GROUP BY lexeme),"
        " x AS (SELECT tf.seq, round(sum(idf.idf * tf.tf * %(k1_plus_1)s"
        " / (tf.tf + %(k1)s * (1 - %(b)s + %(b)s * coalesce(tf.dl, 0) / %(avg_length)s)))"
        f" * 1e12::float8) / 1e12::float8 AS rank FROM tf JOIN idf USING (lexeme) WHERE true{kinds}"
        " GROUP BY tf.seq ORDER BY rank DESC, tf.seq LIMIT %(pool)s)"
    )


def bm25_params(docs: int, avg_length: float) -> dict[str, Any]:
    """The statement's statistics and the shared constants (memory_core/bm25.py), floats
    so the arithmetic is float8."""
    return {"docs": docs, "avg_length": avg_length, "k1": K1, "k1_plus_1": K1 + 1, "b": B}
