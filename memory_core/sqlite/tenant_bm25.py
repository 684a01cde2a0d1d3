"""BM25 counted over one tenant's active memories in its read spaces.

Every statistic BM25 uses comes from the scope's own tables (memory_core/sqlite/
text_index.py): the number of documents, each term's document count (the IDF), each
document's length and the average length, and which terms are too common to score (the
cost budget counts a term's postings in the scope). So another tenant's memories, or
another space's, never change a tenant's ranking, and a word common elsewhere is still
scored where it is rare. The formula is FTS5's `bm25()` (its IDF, clamped to 1e-6 when
not positive) with memrelay's k1 and b (memory_core/bm25.py, shared with Postgres); run
with FTS5's constants, with one tenant in one space, the scores equal FTS5's own (a test
pins it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from memory_core.bm25 import K1, B, idf
from memory_core.sqlite.db import Connection
from memory_core.sqlite.text_index import tokenize

Postings = tuple[np.ndarray, np.ndarray, np.ndarray]  # documents, term frequencies, lengths


class TermHits:
    """Each common term's postings in a scope, kept until the tenant's next write.

    Why: a term costs a row read per posting (about 2 us each on a loaded machine), so
    a common term costs milliseconds, and common terms are the ones queries keep
    repeating (a user's name, their project). Every entry is keyed by
    the head of the tenant's events feed: every change to what the tenant's full-text
    search can see (a memory added, superseded, forgotten, expired) appends an
    event of that tenant in the same transaction. Other tenants' writes change nothing
    here, since no statistic is shared. The IDF and lengths are applied per query from
    the scope's current counts. Rare terms are cheap and not kept.
    """

    MIN_MATCHES = 200
    MAX_ENTRIES = 256

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[Any, ...], Postings] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> Postings | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
            return hit

    def put(self, key: tuple[Any, ...], value: Postings) -> None:
        if len(value[0]) < self.MIN_MATCHES:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.MAX_ENTRIES:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def _in(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


def query_stems(conn: Connection, terms: Sequence[str]) -> list[str]:
    """The query's distinct index terms in order, by the index's own tokenizer (a Python
    stemmer disagrees on some words: "technology" is "technolog" to FTS5)."""
    stems: dict[str, None] = {}
    for found in tokenize(conn, terms):
        stems.update(dict.fromkeys(found))
    return list(stems)


def term_docs(conn: Connection, scopes: Sequence[int], terms: Sequence[str]) -> dict[str, int]:
    """How many documents of the scopes hold each term (terms none holds are absent)."""
    return dict(
        conn.execute(
            f"SELECT term, sum(docs) FROM text_terms WHERE scope IN ({_in(scopes)})"
            f" AND term IN ({_in(terms)}) GROUP BY term",
            [*scopes, *terms],
        ).fetchall()
    )


def choose_terms(hits: dict[str, int], stems: Sequence[str], budget: int) -> list[str]:
    """The rarest terms of the scope within a postings budget (each term's scoring cost
    is its number of postings in the scope). Terms the scope has never seen are dropped."""
    chosen: list[str] = []
    total = 0
    for stem in sorted((s for s in stems if hits.get(s)), key=lambda s: hits[s]):
        if total + hits[stem] > budget:
            break
        chosen.append(stem)
        total += hits[stem]
    return chosen


def _postings(
    conn: Connection,
    scopes: list[int],
    key: tuple[Any, ...],
    term: str,
    cache: TermHits | None,
) -> Postings:
    """The term's postings in the scopes, by document, from the cache when the tenant
    wrote nothing since."""
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit
    rows = conn.execute(
        f"SELECT doc, tf, dl FROM text_postings WHERE scope IN ({_in(scopes)}) AND term = ?"
        " ORDER BY doc",
        [*scopes, term],
    ).fetchall()
    found = np.array(rows, dtype=np.int64).reshape(-1, 3).T
    postings = (found[0], found[1].astype(np.float64), found[2].astype(np.float64))
    if cache is not None:
        cache.put(key, postings)
    return postings


def scored_hits(
    conn: Connection,
    tenant: str,
    spaces: Sequence[str],
    terms: Sequence[str],
    k: int,
    budget: int,
    cache: TermHits | None = None,
    k1: float = K1,
    b: float = B,
) -> list[tuple[int, float]]:
    """The k best (rowid, score) of the tenant's active memories in `spaces` for the
    query's words, lower score is better as with FTS5's `bm25()`. Ties keep the order of
    first appearance (term by term, by document). One read transaction: the counts and
    the postings are of the same moment. `k1` and `b` are the shared constants
    (memory_core/bm25.py); a test passes FTS5's to compare with its `bm25()`."""
    if not terms or not spaces:
        return []
    opened = not conn.in_transaction
    if opened:
        conn.execute("BEGIN")
    try:
        return _scored(conn, tenant, spaces, terms, k, budget, cache, k1, b)
    finally:
        if opened:
            conn.execute("COMMIT")


def _scored(
    conn: Connection,
    tenant: str,
    spaces: Sequence[str],
    terms: Sequence[str],
    k: int,
    budget: int,
    cache: TermHits | None,
    k1: float,
    b: float,
) -> list[tuple[int, float]]:
    scopes_rows = conn.execute(
        f"SELECT id, docs, tokens FROM text_scopes WHERE tenant = ? AND space IN ({_in(spaces)})"
        " AND docs > 0",
        [tenant, *spaces],
    ).fetchall()
    if not scopes_rows:
        return []
    scopes = [row[0] for row in scopes_rows]
    rows = sum(row[1] for row in scopes_rows)
    avgdl = sum(row[2] for row in scopes_rows) / rows
    stems = query_stems(conn, terms)
    if not stems:
        return []
    hits = term_docs(conn, scopes, stems)
    chosen = choose_terms(hits, stems, budget)
    if not chosen:
        return []
    (version,) = conn.execute(
        "SELECT coalesce(max(seq), 0) FROM events WHERE tenant = ?", (tenant,)
    ).fetchone()
    spaces_key = tuple(sorted(spaces))
    parts_r, parts_s = [], []
    for term in chosen:
        docs, tf, dl = _postings(conn, scopes, (version, tenant, spaces_key, term), term, cache)
        if not len(docs):
            continue
        weight = idf(rows, hits[term])
        norm = k1 * (1.0 - b + b * dl / avgdl) if avgdl > 0 else k1 * (1.0 - b)
        parts_r.append(docs)
        parts_s.append(-weight * (tf * (k1 + 1.0)) / (tf + norm))
    if not parts_r:
        return []
    all_r, all_s = np.concatenate(parts_r), np.concatenate(parts_s)
    unique, first, inverse = np.unique(all_r, return_index=True, return_inverse=True)
    totals = np.bincount(inverse, weights=all_s, minlength=len(unique))
    order = np.argsort(first, kind="stable")  # first appearance, as the rows came
    return _best(unique[order], totals[order], k)


def _best(rowids: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k lowest scores, lowest first; ties in their given order."""
    order = np.argsort(scores, kind="stable")[:k]
    return [(int(r), float(s)) for r, s in zip(rowids[order], scores[order], strict=True)]
