"""Hybrid recall: vector KNN and BM25 candidates, fused, then weighed.

Reciprocal rank fusion joins the two rankings without having to calibrate cosine
similarities against BM25 scores; the fused score is then adjusted by confidence,
recency and severity. Every result carries the numbers that made its score.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_core.model import Memory
from memory_core.rows import MEMORY_COLUMNS, memory_from_row
from memory_core.sqlite_db import Connection

RRF_K = 60
MAX_QUERY_CHARS = 4_000
MAX_QUERY_TERMS = 32
SEVERITY_BOOST = {"critical": 1.2, "antipattern": 1.1, "context": 1.0}
RECENCY_HALF_LIFE_DAYS = 30.0
_WORD = re.compile(r"\w+", re.UNICODE)
STOPWORDS = frozenset(
    "a an and are as at be been but by can did do does for from had has have he her him his how"
    " i if in into is it its me my of on or our she so than that the their them then there these"
    " they this to was we were what when where which who why will with would you your".split()
)


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
    text = "".join(ch if ch.isprintable() else " " for ch in text or "")
    text = " ".join(text.split())
    return text[-MAX_QUERY_CHARS:]


def fts_query(text: str) -> str | None:
    """An FTS5 OR-query of the distinct, non-stopword terms, each quoted (no syntax leaks)."""
    terms: list[str] = []
    seen: set[str] = set()
    for word in _WORD.findall(text.lower()):
        if word in STOPWORDS or word in seen or (len(word) < 2 and not word.isdigit()):
            continue
        seen.add(word)
        terms.append(f'"{word}"')
        if len(terms) >= MAX_QUERY_TERMS:
            break
    return " OR ".join(terms) if terms else None


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


def text_search(conn: Connection, q: RecallQuery, match: str, k: int) -> list[tuple[int, float]]:
    """BM25 over active memories of this tenant in the read spaces (lower bm25 is better)."""
    sql = (
        "SELECT rowid, bm25(memory_fts) AS s FROM memory_fts WHERE memory_fts MATCH ?"
        f" AND tenant = ? AND space IN ({_in(q.spaces)}) ORDER BY s LIMIT ?"
    )
    return list(conn.execute(sql, [match, q.tenant, *q.spaces, k]))


def load_active(
    conn: Connection, q: RecallQuery, rowids: list[int], now: float
) -> dict[int, Memory]:
    """The candidates that are active, unexpired and in scope: the SQL is the guard."""
    if not rowids:
        return {}
    sql = (
        f"SELECT rowid, {MEMORY_COLUMNS} FROM memories WHERE rowid IN ({_in(rowids)})"
        f" AND tenant = ? AND status = 'active' AND space IN ({_in(q.spaces)})"
        " AND (expires_at IS NULL OR expires_at > ?)"
    )
    params: list[Any] = [*rowids, q.tenant, *q.spaces, now]
    if q.kinds:
        sql += f" AND kind IN ({_in(q.kinds)})"
        params += q.kinds
    if q.subject:
        sql += " AND subject = ?"
        params.append(q.subject)
    return {row[0]: memory_from_row(row[1:]) for row in conn.execute(sql, params)}


def fuse(
    q: RecallQuery,
    vector_hits: list[tuple[int, float]],
    text_hits: list[tuple[int, float]],
    memories: dict[int, Memory],
    now: float | None = None,
) -> list[Recalled]:
    """Reciprocal rank fusion, then confidence, recency and severity; best first."""
    now = now if now is not None else time.time()
    parts: dict[int, dict[str, Any]] = {}
    for rank, (rowid, similarity) in enumerate(vector_hits, start=1):
        parts.setdefault(rowid, {})
        parts[rowid].update(vector_rank=rank, vector_similarity=round(similarity, 4))
    for rank, (rowid, bm25) in enumerate(text_hits, start=1):
        parts.setdefault(rowid, {})
        parts[rowid].update(text_rank=rank, text_bm25=round(-bm25, 4))
    results = []
    for rowid, info in parts.items():
        memory = memories.get(rowid)
        if memory is None:
            continue
        if "text_rank" not in info and info.get("vector_similarity", 1.0) < q.min_similarity:
            continue
        rrf = sum(1.0 / (RRF_K + info[key]) for key in ("vector_rank", "text_rank") if key in info)
        age_days = max(0.0, now - memory.updated_at) / 86400
        recency = 0.85 + 0.15 * math.pow(0.5, age_days / RECENCY_HALF_LIFE_DAYS)
        confidence = 0.8 + 0.2 * memory.confidence
        severity = SEVERITY_BOOST[memory.severity]
        score = rrf * confidence * recency * severity
        info.update(
            rrf=round(rrf, 6),
            confidence_factor=round(confidence, 4),
            recency_factor=round(recency, 4),
            severity_factor=severity,
            score=round(score, 6),
        )
        results.append(Recalled(memory, score, info))
    results.sort(key=lambda r: r.score, reverse=True)
    return results[: q.top_k]
