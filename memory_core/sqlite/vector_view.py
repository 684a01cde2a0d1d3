"""A consistent view of one tenant's vector copy, searched without its lock.

Why: every recall of a tenant scans its copy; holding the tenant's lock for the whole
scan made concurrent recalls of one tenant queue behind each other (at 16 clients the
lock wait and the scan, stretched by CPU contention, took ~16 ms of a ~42 ms recall).
The lock is now held only to bring the copy up to date and take this view; the scan
runs on the view's arrays (memory_core/sqlite/vector_cache.py says why that is safe).
Exact for small tenants (through the int8 copy with error bounds from INT8_FROM,
memory_core/sqlite/int8_scan.py), sign-bit prefiltered for large ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memory_core.sqlite.int8_scan import Int8Scan, Scored


@dataclass(frozen=True, slots=True)
class VectorView:
    """Rows 0..n-1 of a tenant's copy (see TenantVectors for each array)."""

    n: int
    vectors: np.ndarray
    rowids: np.ndarray
    spaces: np.ndarray
    kinds: np.ndarray
    alive: np.ndarray
    bits: np.ndarray
    codes: dict[str, int]
    int8: Int8Scan | None
    prefilter_from: int
    prefilter_candidates: int

    def search(
        self, vector: np.ndarray, spaces: list[str], kinds: list[str] | None, k: int
    ) -> list[tuple[int, float]]:
        n = self.n
        if n == 0:
            return []
        wanted = [self.codes[s] for s in spaces if s in self.codes]
        if not wanted:
            return []
        mask = self.alive[:n] & self._lookup(wanted)[self.spaces[:n]]
        if kinds:
            mask &= self._lookup([self.codes.get(c, -1) for c in kinds])[self.kinds[:n]]
        k = min(k, int(np.count_nonzero(mask)))
        if k <= 0:
            return []
        query = vector.astype(np.float32)
        if n < self.prefilter_from:
            return self._exact(query, [(mask, k)])[0]
        rows = self._prefilter(query, mask, max(self.prefilter_candidates, 100 * k))
        scores = self.vectors[rows] @ query
        return _top(scores, np.ones(len(rows), dtype=bool), self.rowids[rows], k)

    def search_with_kinds(
        self,
        vector: np.ndarray,
        spaces: list[str],
        k: int,
        kinds: list[str],
        kinds_k: int,
    ) -> tuple[list[tuple[int, float]], list[tuple[int, float]], int]:
        """`search(vector, spaces, None, k)`, plus the `kinds_k` nearest rows of `kinds`
        in those spaces and how many such rows there are, from ONE scan of a small
        tenant (standing rules beside the hybrid recall: a second scan, or a copy of the
        kinds' rows, cost more than the recall's own scan). Large tenants, where both use
        the sign-bit prefilter, get two prefiltered passes."""
        n = self.n
        wanted = [self.codes[s] for s in spaces if s in self.codes]
        if n == 0 or not wanted:
            return [], [], 0
        scope = self.alive[:n] & self._lookup(wanted)[self.spaces[:n]]
        of_kinds = scope & self._lookup([self.codes.get(c, -1) for c in kinds])[self.kinds[:n]]
        in_scope = int(np.count_nonzero(of_kinds))
        if n >= self.prefilter_from:
            return (
                self.search(vector, spaces, None, k),
                self.search(vector, spaces, kinds, kinds_k) if in_scope else [],
                in_scope,
            )
        hits, rules = self._exact(vector.astype(np.float32), [(scope, k), (of_kinds, kinds_k)])
        return hits, rules, in_scope

    def _exact(
        self, query: np.ndarray, wanted: list[tuple[np.ndarray, int]]
    ) -> list[list[tuple[int, float]]]:
        """The exact `k` nearest rows of each mask, from one scan of the whole copy
        (through its int8 copy when the view has one)."""
        n = self.n
        rowids = self.rowids[:n]
        if self.int8 is None:
            scores = self.vectors[:n] @ query
            return [_top(scores, mask, rowids, k) for mask, k in wanted]
        scored = self.int8.scores(query, n)
        return [_top_bounded(scored, self.vectors, query, mask, rowids, k) for mask, k in wanted]

    def _lookup(self, codes: list[int]) -> np.ndarray:
        table = np.zeros(len(self.codes) + 1, dtype=bool)
        table[[c for c in codes if c >= 0]] = True
        return table

    def _prefilter(self, query: np.ndarray, mask: np.ndarray, count: int) -> np.ndarray:
        """Rows in `mask` whose sign bits are closest to the query's (Hamming)."""
        n = self.n
        distance = np.zeros(n, dtype=np.uint16)
        scratch = np.empty(n, dtype=np.uint64)
        for word, query_word in zip(self.bits, sign_bits(query[None, :])[0], strict=True):
            np.bitwise_xor(word[:n], query_word, out=scratch)
            distance += np.bitwise_count(scratch)
        distance[~mask] = np.iinfo(np.uint16).max
        count = min(count, int(np.count_nonzero(mask)))
        rows = np.argpartition(distance, count - 1)[:count]
        return rows[mask[rows]]


def _top(
    scores: np.ndarray, mask: np.ndarray, rowids: np.ndarray, k: int
) -> list[tuple[int, float]]:
    """The `k` best (rowid, score) among rows in `mask`, best first; ties go to the
    smaller rowid, so the answer does not depend on where a row sits in the matrix."""
    rows = np.flatnonzero(mask)  # selecting among many equal -inf is slow: leave them out
    k = min(k, len(rows))
    if k <= 0:
        return []
    scores = scores[rows]
    threshold = np.partition(scores, len(scores) - k)[len(scores) - k]
    top = np.flatnonzero(scores >= threshold)  # k rows, more only on a tie at the cut
    top = top[np.lexsort((rowids[rows[top]], -scores[top]))][:k]
    return [(int(rowids[rows[i]]), float(scores[i])) for i in top]


def _top_bounded(
    scored: Scored,
    vectors: np.ndarray,
    query: np.ndarray,
    mask: np.ndarray,
    rowids: np.ndarray,
    k: int,
) -> list[tuple[int, float]]:
    """`_top` of the float32 scores, from int8 scores and their error bounds: the k best
    int8 rows scored exactly give a threshold no top-k row is below; only rows whose int8
    score plus bound reaches it can be in the top k, and those are scored exactly."""
    rows = np.flatnonzero(mask)
    k = min(k, len(rows))
    if k <= 0:
        return []
    guess = scored.approx[rows]
    first = _best(rows, guess, k)
    threshold = float((vectors[first] @ query).min())
    near = rows[guess >= threshold - scored.max_bound]  # then each row's own bound
    candidates = near[scored.approx[near] + scored.bound(near) >= threshold]
    exact = vectors[candidates] @ query
    return _top(exact, np.ones(len(candidates), dtype=bool), rowids[candidates], k)


def _best(rows: np.ndarray, guess: np.ndarray, k: int) -> np.ndarray:
    """The `k` rows of highest `guess`. Selecting among all rows costs ~80 us at 10k; a
    cut below the best score usually leaves a few hundred to select from."""
    top = float(guess.max())
    for drop in (0.1, 0.2, 0.4):
        pool = np.flatnonzero(guess >= top - drop)
        if len(pool) >= k:
            return rows[pool[np.argpartition(guess[pool], len(pool) - k)[len(pool) - k :]]]
    return rows[np.argpartition(guess, len(guess) - k)[len(guess) - k :]]


def sign_bits(block: np.ndarray) -> np.ndarray:
    """One bit per dimension (positive or not), packed into 64-bit words per row."""
    packed = np.packbits(block > 0, axis=1)
    pad = (-packed.shape[1]) % 8
    if pad:
        packed = np.pad(packed, ((0, 0), (0, pad)))
    return packed.view(np.uint64)
