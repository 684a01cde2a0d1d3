"""The in-process vector copy: exact scan, sign-bit prefilter for big tenants, bulk load."""

from __future__ import annotations

import numpy as np
import pytest

from memory_core.sqlite import int8_scan
from memory_core.sqlite import vector_cache as vector_cache
from memory_core.sqlite.int8_scan import Int8Scan
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
    for a, e in zip(approx, exact, strict=True):  # the nearest, always (the two kernels
        assert a[0][0] == e[0][0]  # may round a score differently in its last bit)
        assert a[0][1] == pytest.approx(e[0][1], abs=1e-6)
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


@pytest.mark.parametrize("prefilter", [False, True])
def test_equal_scores_go_to_the_smaller_rowid_wherever_the_rows_sit(monkeypatch, prefilter):
    """Duplicates (the same text in two spaces) tie exactly; the answer must not depend
    on the order the rows were loaded in, nor on the scan path."""
    if prefilter:
        monkeypatch.setattr(vector_cache, "PREFILTER_FROM", 0)
    block = clustered(500)
    twin = block[7]
    vectors = TenantVectors(block.shape[1])
    vectors.put(900, "work", "constraint", twin)  # the larger rowid is loaded first
    for i, row in enumerate(block):
        vectors.put(i + 1, "default", "constraint", row)
    assert [r for r, _ in vectors.search(twin, ["default", "work"], None, 1)] == [8]
    assert [r for r, _ in vectors.search(twin, ["default", "work"], None, 2)] == [8, 900]
    hits, rules, in_scope = vectors.search_with_kinds(
        twin, ["default", "work"], 1, ["constraint"], 1
    )
    assert [r for r, _ in hits] == [8] and [r for r, _ in rules] == [8] and in_scope == 501


def _near_ties(n: int, seed: int = 3) -> np.ndarray:
    """Tight clusters: many rows within int8 rounding of each other, where an int8
    ranking alone gets the order wrong."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, 384)).astype(np.float32)
    block = centres[rng.integers(0, 20, n)] + 0.02 * rng.standard_normal((n, 384))
    return (block / np.linalg.norm(block, axis=1, keepdims=True)).astype(np.float32)


def test_int8_scan_answers_exactly_as_the_float_scan(monkeypatch):
    block = _near_ties(6000)
    rng = np.random.default_rng(4)
    queries = block[rng.integers(0, len(block), 40)] + 0.01 * rng.standard_normal((40, 384))
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)

    def answers() -> list:
        vectors = filled(block)
        vectors.put(7001, "work", "fact", block[5])  # an exact twin
        for rowid in range(1, 400, 7):
            vectors.drop(rowid)
        vectors.put(7002, "default", "constraint", queries[0])  # after the first scan
        out = []
        for query in queries:
            out.append(vectors.search(query, ["default", "work"], None, 40))
            out.append(vectors.search(query, ["work"], ["fact"], 10))
            hits, rules, scope = vectors.search_with_kinds(
                query, ["default", "work"], 40, ["constraint"], 11
            )
            out += [hits, rules, [(scope, 0.0)]]
        return out

    monkeypatch.setattr(vector_cache, "INT8_FROM", 10**9)
    exact = answers()
    monkeypatch.setattr(vector_cache, "INT8_FROM", 0)
    through_int8 = answers()
    for a, e in zip(through_int8, exact, strict=True):
        assert [r for r, _ in a] == [r for r, _ in e]
        assert [s for _, s in a] == pytest.approx([s for _, s in e], abs=1e-6)


def test_int8_error_bound_holds():
    block = clustered(3000)
    scan = Int8Scan(384)
    scan.set(0, block)
    rng = np.random.default_rng(5)
    for query in rng.standard_normal((20, 384)).astype(np.float32):
        scored = scan.scores(query, len(block))
        approx, bound = scored.approx, scored.bound(np.arange(len(block)))
        assert np.all(bound <= scored.max_bound)
        assert np.all(np.abs(block @ query - approx) <= bound)


def test_the_int8_scan_model_is_one_matmulinteger():
    from onnx import TensorProto, helper

    q = helper.make_tensor_value_info("q", TensorProto.UINT8, [1, None])
    b = helper.make_tensor_value_info("b", TensorProto.INT8, [None, None])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [1, None])
    node = helper.make_node("MatMulInteger", ["q", "b"], ["y"])
    graph = helper.make_graph([node], "int8_scan", [q, b], [y])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="memrelay"
    )
    model.ir_version = 8
    assert model.SerializeToString() == int8_scan.MODEL


def test_a_dropped_row_leaves_no_trace_in_the_int8_copy(monkeypatch):
    """Forgetting zeroes the row in the float32 copy; the int8 copy must follow."""
    monkeypatch.setattr(vector_cache, "INT8_FROM", 0)
    block = clustered(3000)
    vectors = filled(block)
    vectors.search(block[0], ["default", "work"], None, 5)  # builds the int8 copy
    assert vectors.int8 is not None
    index = vectors.position[101]
    assert vectors.int8.blocks[index // int8_scan.BLOCK][:, index % int8_scan.BLOCK].any()
    vectors.drop(101)
    column = vectors.int8.blocks[index // int8_scan.BLOCK][:, index % int8_scan.BLOCK]
    assert not column.any() and vectors.int8.scale[index] == 1.0
    assert not vectors.vectors[index].any()


def test_searches_without_the_lock_survive_concurrent_writes(monkeypatch):
    """A view is searched unlocked while the copy grows, drops rows and compacts under
    its lock (as VectorCache does): no search fails or returns a row never stored."""
    import threading

    monkeypatch.setattr(vector_cache, "INT8_FROM", 256)
    block = clustered(6000, seed=7)
    vectors = TenantVectors(block.shape[1])
    vectors.put_many(np.arange(1, 2001), ["default"] * 2000, ["fact"] * 2000, block[:2000])
    stop = threading.Event()
    failures: list[BaseException] = []

    def search() -> None:
        rng = np.random.default_rng()
        while not stop.is_set():
            try:
                with vectors.lock:
                    view = vectors.view()
                query = block[rng.integers(0, len(block))]
                hits, rules, _ = view.search_with_kinds(query, ["default"], 20, ["fact"], 5)
                assert all(1 <= rowid <= len(block) for rowid, _ in hits + rules)
                assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
            except BaseException as exc:  # reported below
                failures.append(exc)
                return

    readers = [threading.Thread(target=search) for _ in range(3)]
    for reader in readers:
        reader.start()
    compactions = 0
    for i in range(2000, len(block)):
        with vectors.lock:
            vectors.put(i + 1, "default", "fact", block[i])
            for rowid in (2 * (i - 2000) + 1, 2 * (i - 2000) + 2):  # drops outpace puts
                size = vectors.size
                vectors.drop(rowid)
                compactions += vectors.size < size
    stop.set()
    for reader in readers:
        reader.join(timeout=30)
    assert not failures, failures[0]
    assert compactions >= 2  # the arrays were replaced under running searches
