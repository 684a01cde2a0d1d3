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
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

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


class TermHits:
    """Each common term's matches in a scope, with FTS5's scores, kept until the next write.

    Why: a term costs BM25 and a row lookup per match (about 2.4 us each), so a common
    term costs milliseconds: the overhead benchmark's query names two topics of about
    900 memories each, 4-5 ms of the recall. Common terms are also the ones queries keep
    repeating (a user's name, their project). Every entry is keyed by the head of the
    events feed: every change to what full-text search can see (a memory added,
    superseded, forgotten, expired, moved) appends an event in the same transaction, and
    any write anywhere invalidates all entries, since FTS5's IDF and average length are
    shared by all tenants. Rare terms are cheap and not kept.
    """

    MIN_MATCHES = 200
    MAX_ENTRIES = 256

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> tuple[np.ndarray, np.ndarray] | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
            return hit

    def put(self, key: tuple[Any, ...], value: tuple[np.ndarray, np.ndarray]) -> None:
        if len(value[0]) < self.MIN_MATCHES:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.MAX_ENTRIES:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def _term_matches(
    conn: Connection,
    tenant: str,
    spaces: Sequence[str],
    term: str,
    version: int,
    cache: TermHits | None,
) -> tuple[np.ndarray, np.ndarray]:
    """(rowids, FTS5 scores) of the term's matches among the tenant's active memories in
    `spaces`, from the cache when nothing was written since."""
    key = (version, tenant, tuple(spaces), term)
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit
    marks = ",".join("?" * len(spaces))
    rows = conn.execute(
        "WITH hits AS MATERIALIZED (SELECT rowid, bm25(memory_fts) AS s FROM memory_fts"
        " WHERE memory_fts MATCH ?)"
        " SELECT hits.rowid, hits.s FROM hits CROSS JOIN memories m ON m.rowid = hits.rowid"
        f" WHERE m.tenant = ? AND m.status = 'active' AND m.space IN ({marks})",
        [f'"{term}"', tenant, *spaces],
    ).fetchall()
    found = (
        np.fromiter((r for r, _ in rows), dtype=np.int64, count=len(rows)),
        np.fromiter((s for _, s in rows), dtype=np.float64, count=len(rows)),
    )
    if cache is not None:
        cache.put(key, found)
    return found


def scored_hits(
    conn: Connection,
    tenant: str,
    spaces: Sequence[str],
    terms: Sequence[tuple[str, int]],
    k: int,
    counts: ScopeCounts,
    cache: TermHits | None = None,
) -> list[tuple[int, float]]:
    """The k best (rowid, score) of the tenant's active memories in `spaces` for the
    terms (each with its row count in the whole index), lower score is better as with
    FTS5's `bm25()`. Ties keep the order of first appearance (term by term, as matched)."""
    version = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
    matched = [_term_matches(conn, tenant, spaces, t, version, cache) for t, _ in terms]
    if len(terms) == 1:
        # One term: its weight would be the same for every match, and recall's fusion is
        # scale-free (min-max, confidence as a ratio), so FTS5's own scores rank exactly
        # as the tenant's would.
        rowids, scores = matched[0]
        return _best(rowids, scores, k)
    rows = index_rows(conn)
    scope_rows = counts.count(conn, tenant, spaces)
    parts_r, parts_s = [], []
    for (_, index_hits), (rowids, scores) in zip(terms, matched, strict=True):
        if not len(rowids):
            continue
        # the count may be up to SCOPE_COUNT_TTL_S old: never fewer rows than matches
        weight = idf(max(scope_rows, len(rowids)), len(rowids)) / idf(rows, index_hits)
        parts_r.append(rowids)
        parts_s.append(scores * weight)  # score = -idf_index * tf_part
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
