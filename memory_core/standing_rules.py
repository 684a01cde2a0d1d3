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

Where it runs: a recall asks for it by setting `RecallQuery.standing` (the proxy's
recall does); each store finds the candidates its own way (`standing_candidates`) and
passes them through one SQL guard (tenant, status, read spaces, kind, expiry): nothing
reaches a prompt that did not pass it. SQLite scores them in the same scan and reader
job as the hybrid recall's vector side (memory_core/sqlite/standing.py); Postgres in
one statement of its own (memory_core/postgres/standing.py). `with_standing_rules`
is the same step for results recalled without it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from memory_core.model import Memory
from memory_core.recall import Recalled, RecallQuery, clean_query

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
    under the cleaned text, for this tenant); None otherwise: never embedded here."""
    batcher = getattr(store, "batcher", None)
    if batcher is None or not query.use_vector:
        return None
    return batcher.cached(clean_query(query.text), query.tenant)


def rule_room(query: RecallQuery, policy: StandingPolicy) -> bool:
    """Whether `query` may get standing rules at all: a policy with places, a result
    list, read spaces, and no narrowing by its caller (kinds, subject), which gets only
    what it asked for."""
    return (
        policy.slots > 0
        and query.top_k > 0
        and bool(query.spaces)
        and not query.kinds
        and not query.subject
        and query.use_vector
    )


def wanted_rules(results: list[Recalled], query: RecallQuery, policy: StandingPolicy) -> int:
    """How many nearest rules to look at: the places, plus the rules already among the
    results (they are skipped when merging)."""
    present = sum(1 for r in results[: query.top_k] if r.memory.kind in STANDING_KINDS)
    return policy.slots + present


async def with_standing_rules(
    store: Any, query: RecallQuery, results: list[Recalled], policy: StandingPolicy
) -> list[Recalled]:
    """`results` (the hybrid recall's, best first) with up to `policy.slots` standing
    rules merged in; unchanged when there is no cached query vector or no room, and
    when the lookup fails (logged): a rule missed must not cost the facts found."""
    if not rule_room(query, policy):
        return results
    vector = cached_query_vector(store, query)
    if vector is None:
        return results
    try:
        found = await store.standing_candidates(
            query, vector, wanted_rules(results, query, policy), policy
        )
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
    """The `k` standing rules of the query's tenant and read spaces nearest `vector`,
    guarded (with `policy`, only those it could add)."""
    return await store.standing_candidates(query, vector, k, policy)


def qualifying(
    hits: list[tuple[int, float]], in_scope: int, policy: StandingPolicy | None
) -> list[tuple[int, float]]:
    """The hits `policy` could add: all when the tenant has only a few rules in scope,
    else those above the similarity floor (fewer rows for the guard to read)."""
    if policy is not None and in_scope > policy.few:
        return [hit for hit in hits if hit[1] >= policy.min_similarity]
    return hits


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
