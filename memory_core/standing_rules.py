"""Standing rules: a recall path of their own for constraints, preferences and mistakes.

Why: a rule ("always use type hints", "I prefer tabs", "never use pandas") is said once
and applies to later requests that rarely share a word with it ("write me a function
that parses dates"). The hybrid recall ranks by the words a request shares with a
memory, so such rules sink under facts that do share words (bench/rules.py measures
it). So after the hybrid recall, a second lookup ranks only the tenant's active
memories of kinds constraint, preference and error in the read spaces by vector
similarity to the query (the vector the hybrid recall already computed: taken from the
query-vector cache, never embedded again), and up to `slots` of them take the weakest
places of the result list, above a similarity floor, never displacing a fact that is
clearly closer to the query (its similarity beats the rule's by `margin`). A tenant
with only a few standing rules in scope (`few`) gets them all, whatever their
similarity: rules are meant to apply broadly, and a handful costs a few lines.

Cost: on SQLite the candidates come from the in-memory vector cache (only the rows of
those kinds are scored; the cache's own freshness check is one indexed query), then
one SQL statement by rowid is the guard (tenant, status, read spaces, kind, expiry):
nothing reaches a prompt that did not pass it. Without the cache (vec0 KNN mode) and
on Postgres the lookup is one SQL statement of its own.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from memory_core.model import Memory
from memory_core.recall import Recalled, RecallQuery, clean_query, knn
from memory_core.rows import MEMORY_COLUMNS, MEMORY_FIELDS, memory_from_row
from memory_core.sqlite.store import SQLiteStore

STANDING_KINDS = ("constraint", "preference", "error")
log = logging.getLogger("memrelay.memory")


@dataclass(frozen=True)
class StandingPolicy:
    """How many places standing rules may take and which rules qualify.

    Chosen on the tuning half of bench/rules.py (docs/benchmarks.md): the best rule
    recall among policies that cost its LoCoMo control questions nothing, with at most 3
    places, fewer places on a tie. The floor is what keeps facts safe there (0.15 found
    more rules and lost facts). `few` is not measured there (75 rules in one tenant)."""

    slots: int = 3  # at most this many memories added to the result list by this path
    min_similarity: float = 0.25  # a rule below this similarity is not added...
    few: int = 3  # ...unless the tenant has at most this many standing rules in scope
    margin: float = 0.3  # a fact this much closer to the query than the rule stays


@dataclass
class Candidates:
    """Standing rules nearest the query (guarded), and how many are in scope in all."""

    rules: list[tuple[Memory, float]]
    in_scope: int


def cached_query_vector(store: Any, query: RecallQuery) -> np.ndarray | None:
    """The query's vector if the hybrid recall computed it (the batcher's cache holds it
    under the model's name and the cleaned text); None otherwise: never embedded here."""
    batcher = getattr(store, "batcher", None)
    if batcher is None or not query.use_vector:
        return None
    return batcher.cache.get((store.embedder.name, clean_query(query.text)))


async def with_standing_rules(
    store: Any, query: RecallQuery, results: list[Recalled], policy: StandingPolicy
) -> list[Recalled]:
    """`results` (the hybrid recall's, best first) with up to `policy.slots` standing
    rules merged in; unchanged when there is no cached query vector or no room, and
    when the lookup fails (logged): a rule missed must not cost the facts found."""
    if policy.slots <= 0 or query.top_k <= 0 or not query.spaces:
        return results
    if query.kinds or query.subject:
        return results  # a recall narrowed by its caller gets only what it asked for
    vector = cached_query_vector(store, query)
    if vector is None:
        return results
    present = sum(1 for r in results[: query.top_k] if r.memory.kind in STANDING_KINDS)
    try:
        found = await candidates(store, query, vector, policy.slots + present, policy)
    except Exception:  # the hybrid recall succeeded: its results still go out
        log.exception("standing-rule lookup failed; the hybrid recall's results stand alone")
        return results
    return merge(results, found, query.top_k, policy)


async def candidates(
    store: Any,
    query: RecallQuery,
    vector: np.ndarray,
    k: int,
    policy: StandingPolicy | None = None,
) -> Candidates:
    """The `k` standing rules of the query's tenant and read spaces nearest `vector`
    (with `policy`, only those it could add: fewer rows for the guard to read)."""
    now = time.time()
    if isinstance(store, SQLiteStore):
        return await store.run_read(
            lambda conn: _sqlite_candidates(store, conn, query, vector, k, now, policy)
        )
    from memory_core.postgres.store import PostgresStore  # psycopg loads only when used

    if isinstance(store, PostgresStore):
        return await _postgres_candidates(store, query, vector, k, now)
    return Candidates([], 0)  # another store: the hybrid results stand alone


def merge(
    results: list[Recalled], found: Candidates, top_k: int, policy: StandingPolicy
) -> list[Recalled]:
    """Up to `policy.slots` rules not already in `results` replace its weakest entries:
    only among its last `slots` places (the first `top_k - slots` always stay), and
    never a standing rule or a fact clearly closer to the query."""
    out = list(results[:top_k])
    present = {r.memory.id for r in out}
    kept = {r.memory.id for r in out[: max(0, top_k - policy.slots)]}
    few = found.in_scope <= policy.few
    added = 0
    for memory, similarity in found.rules:
        if added >= policy.slots:
            break
        if memory.id in present or (not few and similarity < policy.min_similarity):
            continue
        if len(out) >= top_k:
            victim = _weakest(out, kept, similarity, policy.margin)
            if victim is None:
                break  # every remaining place holds a rule or a clearly better fact
            out.pop(victim)
        info = {"standing_similarity": round(similarity, 4), "standing_slot": True}
        out.append(Recalled(memory, out[-1].score if out else 0.0, info))
        present.add(memory.id)
        added += 1
    return out


def _weakest(out: list[Recalled], kept: set[str], similarity: float, margin: float) -> int | None:
    """Index of the last entry a rule of `similarity` may take, or None."""
    for index in range(len(out) - 1, -1, -1):
        result = out[index]
        if result.memory.id in kept:
            return None  # the places above are not the rules' to take
        if result.breakdown.get("standing_slot") or result.memory.kind in STANDING_KINDS:
            continue
        if result.breakdown.get("vector_similarity", -1.0) >= similarity + margin:
            continue
        return index
    return None


# -- SQLite ---------------------------------------------------------------------------


def _sqlite_candidates(
    store: Any,
    conn: Any,
    query: RecallQuery,
    vector: np.ndarray,
    k: int,
    now: float,
    policy: StandingPolicy | None = None,
) -> Candidates:
    cache = getattr(store, "_cache", None)
    if cache is None:  # vec0 KNN mode: the kind filter runs inside sqlite-vec
        scoped = replace(query, kinds=list(STANDING_KINDS))
        hits = knn(conn, scoped, vector, k)
        in_scope = _count_in_scope(conn, query)
    else:
        hits, in_scope = _cache_hits(cache, conn, query, vector, k)
    if policy is not None and in_scope > policy.few:
        hits = [hit for hit in hits if hit[1] >= policy.min_similarity]
    return Candidates(_guarded(conn, query, hits, now), in_scope)


def _cache_hits(
    cache: Any, conn: Any, query: RecallQuery, vector: np.ndarray, k: int
) -> tuple[list[tuple[int, float]], int]:
    """Nearest standing rows of the tenant's cached vectors: only those rows are scored.

    The rows of standing kinds are found once per version of the tenant's copy (its
    event seq and size change with every write), so a recall scores a few rows only."""
    vectors = cache._current(conn, query.tenant)  # brought up to date from the event feed
    with vectors.lock:
        rows = _standing_rows(vectors)
        wanted = [vectors.codes[s] for s in query.spaces if s in vectors.codes]
        if not len(rows) or not wanted:
            return [], 0
        lookup = np.zeros(len(vectors.codes) + 1, dtype=bool)
        lookup[wanted] = True
        rows = rows[lookup[vectors.spaces[rows]]]
        if not len(rows):
            return [], 0
        scores = vectors.vectors[rows] @ np.asarray(vector, np.float32)
        top = np.argsort(-scores)[:k]
        return [(int(vectors.rowids[rows[i]]), float(scores[i])) for i in top], len(rows)


# Per tenant copy (dropped with it): its version and the rows of standing kinds.
_ROWS: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int, int], np.ndarray]] = (
    weakref.WeakKeyDictionary()
)
_ROWS_LOCK = threading.Lock()


def _standing_rows(vectors: Any) -> np.ndarray:
    """Live rows of standing kinds in one tenant's copy (memoised per version)."""
    version = (vectors.seq, vectors.size, len(vectors.codes))
    with _ROWS_LOCK:
        memo = _ROWS.get(vectors)
    if memo is not None and memo[0] == version:
        return memo[1]
    n = vectors.size
    codes = [vectors.codes[k] for k in STANDING_KINDS if k in vectors.codes]
    if not codes or n == 0:
        rows = np.zeros(0, dtype=np.int64)
    else:
        lookup = np.zeros(len(vectors.codes) + 1, dtype=bool)
        lookup[codes] = True
        rows = np.flatnonzero(vectors.alive[:n] & lookup[vectors.kinds[:n]])
    with _ROWS_LOCK:
        _ROWS[vectors] = (version, rows)
    return rows


def _count_in_scope(conn: Any, query: RecallQuery) -> int:
    sql = (
        f"SELECT count(*) FROM memories WHERE tenant = ? AND status = 'active'"
        f" AND kind IN ({_marks(STANDING_KINDS)}) AND space IN ({_marks(query.spaces)})"
    )
    return int(conn.execute(sql, [query.tenant, *STANDING_KINDS, *query.spaces]).fetchone()[0])


def _guarded(
    conn: Any, query: RecallQuery, hits: list[tuple[int, float]], now: float
) -> list[tuple[Memory, float]]:
    """The hits that are this tenant's active, unexpired standing rules in a read space,
    nearest first: this SQL is the guard, whatever the candidates' source."""
    if not hits:
        return []
    rowids = [rowid for rowid, _ in hits]
    sql = (
        f"SELECT rowid, {MEMORY_COLUMNS} FROM memories WHERE rowid IN ({_marks(rowids)})"
        f" AND tenant = ? AND status = 'active' AND space IN ({_marks(query.spaces)})"
        f" AND kind IN ({_marks(STANDING_KINDS)}) AND (expires_at IS NULL OR expires_at > ?)"
    )
    params = [*rowids, query.tenant, *query.spaces, *STANDING_KINDS, now]
    found = {row[0]: memory_from_row(row[1:]) for row in conn.execute(sql, params)}
    return [(found[rowid], similarity) for rowid, similarity in hits if rowid in found]


def _marks(values: Any) -> str:
    return ",".join("?" * len(values))


# -- Postgres -------------------------------------------------------------------------


async def _postgres_candidates(
    store: Any, query: RecallQuery, vector: np.ndarray, k: int, now: float
) -> Candidates:
    """One statement: the scope (the guard) first, materialised, then ranked exactly, so
    the HNSW index (approximate, filtered after the fact) is never used for it."""
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
