"""The in-process vector copy: exact scan, sign-bit prefilter for big tenants, bulk load."""

from __future__ import annotations

import numpy as np

from memory_core.sqlite import vector_cache as vector_cache
from memory_core.sqlite.vector_cache import TenantVectors


def clustered(n: int, dim: int = 384, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((50, dim)).astype(np.float32)
    block = centres[rng.integers(0, 50, n)] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32)
    return block / np.linalg.norm(block, axis=1, keepdims=True)


def filled(block: np.ndarray) -> TenantVectors:
    vectors = TenantVectors(block.shape[1])
    n = len(block)
    spaces = ["default" if i % 3 else "work" for i in range(n)]
    kinds = ["fact" if i % 2 else "constraint" for i in range(n)]
    vectors.put_many(np.arange(1, n + 1), spaces, kinds, block)
    return vectors


def test_bulk_load_matches_one_by_one_puts():
    block = clustered(3000)
    bulk = filled(block)
    single = TenantVectors(block.shape[1])
    for i, row in enumerate(block):
        single.put(i + 1, "default" if i % 3 else "work", "fact" if i % 2 else "constraint", row)
    for query in block[:20]:
        assert bulk.search(query, ["default"], None, 10) == single.search(
            query, ["default"], None, 10
        )


def test_prefilter_finds_what_the_exact_scan_finds(monkeypatch):
    block = clustered(20_000)
    vectors = filled(block)
    rng = np.random.default_rng(1)
    queries = block[rng.integers(0, len(block), 50)] + 0.05 * rng.standard_normal((50, 384))
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    exact = [vectors.search(q, ["default", "work"], ["fact"], 10) for q in queries]
    monkeypatch.setattr(vector_cache, "PREFILTER_FROM", 0)
    monkeypatch.setattr(vector_cache, "PREFILTER_CANDIDATES", 2000)
    approx = [vectors.search(q, ["default", "work"], ["fact"], 10) for q in queries]
    overlap = [
        len({r for r, _ in a} & {r for r, _ in e}) / 10 for a, e in zip(approx, exact, strict=True)
    ]
    assert np.mean(overlap) >= 0.95
    assert all(a[0] == e[0] for a, e in zip(approx, exact, strict=True))  # the nearest, always
    for results in approx:  # filters hold on the prefiltered path too
        assert all(rowid % 2 == 0 for rowid, _ in results)  # kind "fact": odd index = even id
        assert [s for _, s in results] == sorted((s for _, s in results), reverse=True)


def test_dropped_and_out_of_scope_rows_never_come_back(monkeypatch):
    block = clustered(5000)
    vectors = filled(block)
    monkeypatch.setattr(vector_cache, "PREFILTER_FROM", 0)
    target = block[10]
    assert vectors.search(target, ["default", "work"], None, 1)[0][0] == 11
    vectors.drop(11)
    assert 11 not in [r for r, _ in vectors.search(target, ["default", "work"], None, 50)]
    work_only = vectors.search(target, ["work"], None, 50)
    assert all((rowid - 1) % 3 == 0 for rowid, _ in work_only)
    assert vectors.search(target, ["nowhere"], None, 5) == []
