"""Hybrid recall: vector KNN and BM25 candidates, fused, then weighed.

Each side's scores are min-max normalised over that side's candidates (so both run
from 0 to 1 whatever the engine's scale), then mixed with weights chosen per query from
how confident each side is (how far its best candidate stands above the rest); the
fused score is adjusted by confidence, recency and severity. Every result carries the
numbers that made its score.
"""

from __future__ import annotations

import json
import math
import re
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from memory_core.model import Memory, severity_of
from memory_core.rows import MEMORY_COLUMNS, memory_from_row
from memory_core.sqlite.db import Connection
from memory_core.sqlite.tenant_bm25 import TermHits, scored_hits

if TYPE_CHECKING:
    from memory_core.standing_rules import StandingPolicy

# Score fusion, chosen on LoCoMo's tuning half only (bench/locomo.py, conversations
# 0-4) and kept because it also won on the held-out half (5-9): min-max normalisation
# with per-query weights. A side's confidence is (best - the CONFIDENCE_DEPTH-th best)
# / best among its candidates (missing candidates count as 0); the weights are
# TEXT_WEIGHT * text confidence and (1 - TEXT_WEIGHT) * vector confidence, rescaled to
# sum to 1. Held-out turn any@10 / session all@5: 0.691 / 0.790 with the former fixed
# 0.7 / 0.3 max-normalised mix, 0.714 / 0.798 with this (docs/benchmarks.md).
TEXT_WEIGHT = 0.5
CONFIDENCE_DEPTH = 20
MAX_QUERY_CHARS = 4_000
MAX_QUERY_TERMS = 32
POSTINGS_BUDGET = 2_000
COMMON_TTL_S = 300.0
ENTITY_BOOST = 1.15
SEVERITY_BOOST = {"critical": 1.2, "antipattern": 1.1, "context": 1.0}
RECENCY_HALF_LIFE_DAYS = 30.0
_WORD = re.compile(r"\w+", re.UNICODE)
STOPWORDS = frozenset(
    "a an and are as at be been but by can did do does for from had has have he her him his how"
    " i if in into is it its me my of on or our she so than that the their them then there these"
    " they this to was we were what when where which who why will with would you your".split()
)


@dataclass(frozen=True)
class Fusion:
    """How the two sides' scores are mixed: the defaults were tuned with MiniLM; an
    embedder whose similarities spread differently carries its own (`fusion`)."""

    text_weight: float = TEXT_WEIGHT
    confidence_depth: int = CONFIDENCE_DEPTH


DEFAULT_FUSION = Fusion()


@dataclass
class RecallQuery:
    tenant: str
    spaces: list[str]
    text: str
    top_k: int = 10
    kinds: list[str] | None = None
    subject: str | None = None
    min_similarity: float = 0.0
    use_vector: bool = True
    use_text: bool = True
    background: bool = False  # learning's own lookups: embedded after waiting recalls, exactly
    # Embed the query with the exact model, as memories are (forget-by-query: a
    # similarity floor decides what is erased), not the faster query copy.
    exact_vector: bool = False
    # Standing rules merged into the results by this policy (memory_core/standing_rules.py);
    # None: the hybrid results alone.
    standing: StandingPolicy | None = None


@dataclass
class Recalled:
    """A recalled memory, its final score and why."""

    memory: Memory
    score: float
    breakdown: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"memory": self.memory.as_dict(), "score": self.score, "breakdown": self.breakdown}


def clean_query(text: str) -> str:
    """Printable text only, capped; the newest (last) part is kept when it is too long."""
    text = text or ""
    if not text.isprintable():  # a per-character pass only when there is something to drop
        text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = " ".join(text.split())
    return text[-MAX_QUERY_CHARS:]


def query_terms(text: str) -> list[str]:
    """Distinct non-stopword words of the query, accents folded, at most MAX_QUERY_TERMS."""
    terms: list[str] = []
    for word in _WORD.findall(fold(text)):
        if word in STOPWORDS or word in terms or (len(word) < 2 and not word.isdigit()):
            continue
        terms.append(word)
        if len(terms) >= MAX_QUERY_TERMS:
            break
    return terms


def fold(text: str) -> str:
    if text.isascii():  # nothing to decompose: the common case, without a per-character pass
        return text.lower()
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def _mentions(folded_query: str, entities: list[str]) -> bool:
    """Whether the query names one of a memory's tagged entities (`label:text`)."""
    for entity in entities:
        name = fold(entity.split(":", 1)[-1]).strip()
        if len(name) >= 2 and re.search(rf"\b{re.escape(name)}\b", folded_query):
            return True
    return False


def _in(values: list[Any]) -> str:
    return ",".join("?" * len(values))


def knn(conn: Connection, q: RecallQuery, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Nearest active vectors of this tenant (partition) in the read spaces."""
    sql = (
        "SELECT rowid, distance FROM memory_vec WHERE embedding MATCH ? AND k = ?"
        f" AND tenant = ? AND space IN ({_in(q.spaces)})"
    )
    params: list[Any] = [np.asarray(vector, np.float32).tobytes(), k, q.tenant, *q.spaces]
    if q.kinds:
        sql += f" AND kind IN ({_in(q.kinds)})"
        params += q.kinds
    return [(rowid, 1.0 - distance) for rowid, distance in conn.execute(sql, params)]


def text_search(
    conn: Connection,
    q: RecallQuery,
    terms: list[str],
    k: int,
    term_hits: TermHits | None = None,
) -> list[tuple[int, float]]:
    """BM25 over the tenant's active memories in the read spaces (lower is better), with
    every statistic counted over those memories, not the whole index
    (memory_core/sqlite/tenant_bm25.py): another tenant's data never changes the ranking.

    A word with many postings costs milliseconds to score and, its IDF being low, adds
    little to the ranking (the vector side still sees it): the rarest words are scored
    within POSTINGS_BUDGET postings, counted in the tenant's read spaces.
    """
    return scored_hits(conn, q.tenant, q.spaces, terms, k, POSTINGS_BUDGET, term_hits)


RANK_COLUMNS = "kind, confidence, subject, attribute, entities, observed_at, updated_at"


@dataclass(slots=True)
class RankFacts:
    """What ranking reads of a candidate. A recall weighs about 80 candidates and keeps
    10; decoding every candidate's whole row (provenance JSON and all) held the GIL for
    about 1.5 ms a recall, so only the winners are loaded whole (`load_active`)."""

    kind: str
    confidence: float
    subject: str | None
    attribute: str | None
    entities: list[str]
    observed_at: float | None
    updated_at: float

    @property
    def severity(self) -> str:
        return severity_of(self.kind)


def _guard(q: RecallQuery, rowids: list[int], now: float) -> tuple[str, list[Any]]:
    """The WHERE clause that keeps a candidate: active, unexpired, this tenant, a read
    space (and the query's kinds and subject). The SQL is the guard.

    `+tenant` keeps SQLite from answering through the scope index (one probe per read
    space and candidate): the candidates are looked up by rowid, then checked, about 35%
    faster for a recall's ~80 candidates."""
    sql = (
        f"rowid IN ({_in(rowids)}) AND +tenant = ? AND status = 'active'"
        f" AND space IN ({_in(q.spaces)}) AND (expires_at IS NULL OR expires_at > ?)"
    )
    params: list[Any] = [*rowids, q.tenant, *q.spaces, now]
    if q.kinds:
        sql += f" AND kind IN ({_in(q.kinds)})"
        params += q.kinds
    if q.subject:
        sql += " AND subject = ?"
        params.append(q.subject)
    return sql, params


def load_active(
    conn: Connection, q: RecallQuery, rowids: list[int], now: float
) -> dict[int, Memory]:
    """The candidates that are active, unexpired and in scope, whole."""
    if not rowids:
        return {}
    where, params = _guard(q, rowids, now)
    sql = f"SELECT rowid, {MEMORY_COLUMNS} FROM memories WHERE {where}"
    return {row[0]: memory_from_row(row[1:]) for row in conn.execute(sql, params)}


def load_rank_facts(
    conn: Connection, q: RecallQuery, rowids: list[int], now: float
) -> dict[int, RankFacts]:
    """What ranking needs of the candidates that pass the same guard as `load_active`."""
    if not rowids:
        return {}
    where, params = _guard(q, rowids, now)
    sql = f"SELECT rowid, {RANK_COLUMNS} FROM memories WHERE {where}"
    return {
        row[0]: RankFacts(
            row[1],
            row[2],
            row[3],
            row[4],
            json.loads(row[5]) if row[5] and row[5] != "[]" else [],
            row[6],
            row[7],
        )
        for row in conn.execute(sql, params)
    }


def fuse(
    q: RecallQuery,
    vector_hits: list[tuple[int, float]],
    text_hits: list[tuple[int, float]],
    memories: dict[int, Memory],
    now: float | None = None,
    text_key: str = "text_bm25",
    fusion: Fusion = DEFAULT_FUSION,
) -> list[Recalled]:
    """`rank` over whole memories (the Postgres store loads them in its search)."""
    ranked = rank(q, vector_hits, text_hits, memories, now, text_key, fusion)
    return [Recalled(memories[rowid], score, info) for rowid, score, info in ranked]


def rank(
    q: RecallQuery,
    vector_hits: list[tuple[int, float]],
    text_hits: list[tuple[int, float]],
    facts: Mapping[int, RankFacts | Memory],
    now: float | None = None,
    text_key: str = "text_bm25",
    fusion: Fusion = DEFAULT_FUSION,
) -> list[tuple[int, float, dict[str, Any]]]:
    """Normalised score fusion, then confidence, recency and severity; the best `top_k`
    as (rowid, score, breakdown), best first. Candidates missing from `facts` (out of
    scope, inactive) are dropped.

    Text hits carry a lower-is-better score (SQLite's bm25); the breakdown shows it
    negated under `text_key`, named after the engine's ranking function. Breakdowns are
    written out for the winners only.
    """
    now = now if now is not None else time.time()
    folded_query = fold(q.text)
    # Ranks count only candidates that passed the guard (in scope, active).
    vector_hits = [hit for hit in vector_hits if hit[0] in facts]
    text_hits = [hit for hit in text_hits if hit[0] in facts]
    vector_at = {rowid: rank for rank, (rowid, _) in enumerate(vector_hits, start=1)}
    text_at = {rowid: rank for rank, (rowid, _) in enumerate(text_hits, start=1)}
    text_norm = _min_max([-bm25 for _, bm25 in text_hits])
    vector_norm = _min_max([similarity for _, similarity in vector_hits])
    text_weight, vector_weight = side_weights(
        [-bm25 for _, bm25 in text_hits],
        [similarity for _, similarity in vector_hits],
        fusion,
    )
    scored: list[_Scored] = []
    for rowid in dict.fromkeys([*vector_at, *text_at]):
        fact = facts[rowid]
        t_rank, v_rank = text_at.get(rowid), vector_at.get(rowid)
        if t_rank is None and v_rank is not None and vector_hits[v_rank - 1][1] < q.min_similarity:
            continue
        fused = 0.0
        if t_rank is not None:
            fused += text_weight * text_norm(-text_hits[t_rank - 1][1])
        if v_rank is not None:
            fused += vector_weight * vector_norm(vector_hits[v_rank - 1][1])
        age_days = max(0.0, now - said_at(fact)) / 86400
        recency = 0.85 + 0.15 * math.pow(0.5, age_days / RECENCY_HALF_LIFE_DAYS)
        confidence = 0.8 + 0.2 * fact.confidence
        severity = SEVERITY_BOOST[fact.severity]
        score = fused * confidence * recency * severity
        entity = bool(fact.entities) and _mentions(folded_query, fact.entities)
        if entity:
            score *= ENTITY_BOOST
        scored.append(_Scored(rowid, fact, score, fused, confidence, recency, severity, entity))
    newest_version_first(scored)
    scored.sort(key=lambda s: s.score, reverse=True)
    out = []
    for s in scored[: q.top_k]:
        info: dict[str, Any] = {}
        if (v_rank := vector_at.get(s.rowid)) is not None:
            info.update(vector_rank=v_rank, vector_similarity=round(vector_hits[v_rank - 1][1], 4))
        if (t_rank := text_at.get(s.rowid)) is not None:
            info.update({"text_rank": t_rank, text_key: round(-text_hits[t_rank - 1][1], 4)})
        if s.entity:
            info["entity_factor"] = ENTITY_BOOST
        info.update(
            text_weight=round(text_weight, 4),
            vector_weight=round(vector_weight, 4),
            fused=round(s.fused, 6),
            confidence_factor=round(s.confidence, 4),
            recency_factor=round(s.recency, 4),
            severity_factor=s.severity,
            score=round(s.score, 6),
        )
        if s.version_rank is not None:
            info["version_rank"] = s.version_rank
        out.append((s.rowid, s.score, info))
    return out


@dataclass(slots=True)
class _Scored:
    rowid: int
    memory: RankFacts | Memory
    score: float
    fused: float
    confidence: float
    recency: float
    severity: float
    entity: bool
    version_rank: int | None = None


def confidence(scores: list[float], depth: int = CONFIDENCE_DEPTH) -> float:
    """How far the best score stands above the `depth`-th (0 when absent)."""
    ranked = sorted(scores, reverse=True)
    if not ranked or ranked[0] <= 0:
        return 0.0
    reference = ranked[depth] if len(ranked) > depth else 0.0
    return max(0.0, ranked[0] - reference) / ranked[0]


def side_weights(
    text_scores: list[float], vector_scores: list[float], fusion: Fusion = DEFAULT_FUSION
) -> tuple[float, float]:
    """This query's weights of the text and vector sides (higher score = better)."""
    base = fusion.text_weight
    text = base * confidence(text_scores, fusion.confidence_depth)
    vector = (1 - base) * confidence(vector_scores, fusion.confidence_depth)
    if text + vector <= 0:
        return base, 1 - base
    return text / (text + vector), vector / (text + vector)


def _min_max(scores: list[float]) -> Any:
    """x -> (x - min) / (max - min) over `scores`; 1 when they are all equal."""
    if not scores:
        return lambda x: 0.0
    low, high = min(scores), max(scores)
    if high <= low:
        return lambda x: 1.0
    return lambda x: (x - low) / (high - low)


def said_at(memory: RankFacts | Memory) -> float:
    """When the thing was said: `observed_at` if known, else when it was last written."""
    return memory.observed_at if memory.observed_at is not None else memory.updated_at


def newest_version_first(results: list[Any]) -> None:
    """Memories of one slot (same subject and attribute) that are all active are versions
    of one fact (imported, or added without reconciliation): the newest said takes the
    best score of the group, so the latest version ranks first whatever its wording.
    `results` hold `.memory`, `.score` and `.version_rank`."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for result in results:
        memory = result.memory
        if memory.subject and memory.attribute:
            groups.setdefault((memory.subject, memory.attribute), []).append(result)
    for group in groups.values():
        if len(group) < 2:
            continue
        scores = sorted((r.score for r in group), reverse=True)
        by_time = sorted(group, key=lambda r: said_at(r.memory), reverse=True)
        for position, (result, score) in enumerate(zip(by_time, scores, strict=True), start=1):
            result.score = score
            result.version_rank = position
