"""One hybrid search of a tenant's SQLite memories once the query's vector is known: the
vector scan, the full-text side, ranking, the SQL guard and the standing rules.

Why a module of its own: this is the part of recall that holds the GIL (ranking, row
decoding, the scan's bookkeeping). The store runs it on its reader threads, or sends it
to the search process (memory_core/sqlite/search_process.py) so that it no longer
competes with the event loop for the GIL; both run this same function.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from memory_core.recall import (
    DEFAULT_FUSION,
    Fusion,
    Recalled,
    RecallQuery,
    knn,
    load_active,
    load_rank_facts,
    rank,
    text_search,
)
from memory_core.sqlite.db import Connection
from memory_core.sqlite.standing import KINDS as STANDING
from memory_core.sqlite.standing import found as standing_found
from memory_core.sqlite.standing import standing_candidates
from memory_core.sqlite.tenant_bm25 import TermHits
from memory_core.sqlite.vector_cache import VectorCache
from memory_core.standing_rules import StandingPolicy, merge, wanted_rules

log = logging.getLogger("memrelay.memory")

Hits = list[tuple[int, float]]


@dataclass(frozen=True)
class SearchRequest:
    """Everything one search needs besides the database (picklable: it crosses to the
    search process)."""

    query: RecallQuery
    terms: list[str]
    pool: int  # candidates taken from each side
    vector: np.ndarray | None  # None: text only
    policy: StandingPolicy | None  # standing rules merged in, when there is room
    rules_k: int  # standing-rule candidates taken from the same scan
    now: float
    fusion: Fusion = DEFAULT_FUSION
    text_hits: Hits | None = None  # full-text hits found already (None: search here)


def hybrid_search(
    conn: Connection,
    cache: VectorCache | None,
    term_hits: TermHits | None,
    request: SearchRequest,
) -> list[Recalled]:
    """The ranked, guarded results of `request`; its full-text side runs here unless the
    request brings hits found already (`text_hits`: found while the query was embedded)."""
    query, vector, policy, now = request.query, request.vector, request.policy, request.now
    rule_hits: Hits = []
    in_scope = 0
    if vector is None:
        vector_hits: Hits = []
    elif policy is not None and cache is not None:
        # The standing rules' candidates come from the same scan (one matrix product
        # for both); without the cache they are looked up on their own below.
        vector_hits, rule_hits, in_scope = cache.search_with_kinds(
            conn, query.tenant, query.spaces, vector, request.pool, STANDING, request.rules_k
        )
    elif cache is not None:
        vector_hits = cache.search(
            conn, query.tenant, query.spaces, query.kinds, vector, request.pool
        )
    else:
        vector_hits = knn(conn, query, vector, request.pool)
    if request.text_hits is not None:
        found_text = request.text_hits
    elif request.terms:
        found_text = text_search(conn, query, request.terms, request.pool, term_hits)
    else:
        found_text = []
    rowids = list({r for r, _ in vector_hits} | {r for r, _ in found_text})
    facts = load_rank_facts(conn, query, rowids, now)
    ranked = rank(query, vector_hits, found_text, facts, now, fusion=request.fusion)
    # The winners whole, through the same guard: one forgotten in between is gone.
    memories = load_active(conn, query, [rowid for rowid, _, _ in ranked], now)
    results = [Recalled(memories[r], s, info) for r, s, info in ranked if r in memories]
    if policy is None or vector is None:
        return results
    try:
        k = wanted_rules(results, query, policy)
        if cache is None:
            rules = standing_candidates(None, conn, query, vector, k, now, policy)
        else:
            rules = standing_found(conn, query, rule_hits[:k], in_scope, now, policy)
    except Exception:  # the hybrid recall succeeded: its results still go out
        log.exception("standing-rule lookup failed; the hybrid results stand alone")
        return results
    return merge(results, rules, query.top_k, policy)
