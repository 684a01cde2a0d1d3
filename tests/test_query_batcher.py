"""The query batcher: own vectors, bounded batches, recall before bulk work, fairness
across tenants, the query cache, cancelled callers, errors reaching every caller.

The real embedding model does the work; `Gated` only records the calls and can hold
the worker inside one call, so the queue behind it is built deterministically.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

from memory_core.query_batcher import QueryBatcher


class Gated:
    """The real embedder, its calls recorded; `hold()` parks the next call until `release()`."""

    def __init__(self, inner: Any, fail_on: str | None = None, shared: bool = True) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        # may queries of different tenants share a call (False: the dynamic copy's case)
        self.query_batch_shared = shared
        self.calls: list[tuple[str, list[str]]] = []
        self.fail_on = fail_on
        self._hold = False
        self.entered = threading.Event()
        self._gate = threading.Event()

    def hold(self) -> None:
        self._hold = True
        self.entered.clear()
        self._gate.clear()

    def release(self) -> None:
        self._hold = False
        self._gate.set()

    def _call(self, kind: str, texts: list[str]) -> np.ndarray:
        self.calls.append((kind, list(texts)))
        if self._hold:
            self.entered.set()
            assert self._gate.wait(60)
        if self.fail_on and any(self.fail_on in t for t in texts):
            raise ValueError(f"cannot embed {self.fail_on!r}")
        return self.inner.embed_queries(texts) if kind == "query" else self.inner.embed(texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._call("bulk", texts)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._call("query", texts)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


async def settle() -> None:
    for _ in range(5):  # let every created task run up to its first await
        await asyncio.sleep(0)


async def parked(gated: Gated, batcher: QueryBatcher) -> asyncio.Task:
    """A first query that holds the worker inside its embedding call."""
    gated.hold()
    task = asyncio.ensure_future(batcher.query("the worker is busy with this one", "t0"))
    await asyncio.get_running_loop().run_in_executor(None, gated.entered.wait, 60)
    return task


@pytest.fixture(scope="module")
def exact_embedder() -> Any:
    """The model itself for queries: it embeds a batch in one call."""
    from memory_core import FastEmbedEmbedder

    return FastEmbedEmbedder(query_model="exact")


def test_each_caller_gets_its_own_vector_same_as_unbatched(exact_embedder):
    """The exact model: concurrent queries of several tenants share calls, and each
    caller gets the vector of its text alone."""
    texts = [f"what do I know about topic number {i} and its neighbours?" for i in range(24)]
    batcher = QueryBatcher(exact_embedder, max_batch=8)

    async def main() -> list[np.ndarray]:
        return await asyncio.gather(
            *(batcher.query(t, f"tenant{i % 3}") for i, t in enumerate(texts))
        )

    try:
        got = asyncio.run(main())
    finally:
        batcher.close()
    for text, vector in zip(texts, got, strict=True):
        alone = exact_embedder.embed_queries([text])[0]
        assert vector.shape == (exact_embedder.dim,)
        np.testing.assert_allclose(vector, alone, atol=1e-4)
    assert batcher.tenants_share_calls and max(batcher.batches) > 1


def test_the_dynamic_copy_batches_one_tenant_per_call(embedder):
    """The dynamic copy's vectors depend a little on their call companions, so a call
    holds one tenant's queries: tenant a's vectors are the same whether tenant b's
    queries were waiting beside them or not (they would differ in a shared call)."""
    assert embedder.query_batch_shared is False and embedder.query_batch > 1
    a_texts = [f"what did I decide about project {i}?" for i in range(4)]
    b_texts = [f"an unrelated question of another tenant, number {i}!" for i in range(4)]

    def run(with_b: bool) -> tuple[list[np.ndarray], list[list[str]]]:
        gated = Gated(embedder, shared=embedder.query_batch_shared)
        batcher = QueryBatcher(gated, max_batch=8, cache_size=0)

        async def main() -> list[np.ndarray]:
            first = await parked(gated, batcher)
            tasks = []
            for i, text in enumerate(a_texts):
                tasks.append(asyncio.ensure_future(batcher.query(text, "a")))
                if with_b:
                    tasks.append(asyncio.ensure_future(batcher.query(b_texts[i], "b")))
            await settle()
            gated.release()
            await first
            got = await asyncio.gather(*tasks)
            return list(got[::2] if with_b else got)  # a's vectors (a, b alternate)

        try:
            vectors = asyncio.run(main())
        finally:
            batcher.close()
        return vectors, [texts for kind, texts in gated.calls if kind == "query"][1:]

    beside_b, calls = run(with_b=True)
    alone, _ = run(with_b=False)
    assert sorted(map(sorted, calls)) == sorted([sorted(a_texts), sorted(b_texts)])
    for got, expected in zip(beside_b, alone, strict=True):
        np.testing.assert_array_equal(got, expected)
    for text, vector in zip(a_texts, beside_b, strict=True):  # close to the text alone
        assert float(vector @ embedder.embed_queries([text])[0]) > 0.98


def test_the_dynamic_copy_never_shares_a_vector_across_tenants(embedder):
    """A cached or in-flight vector computed in tenant a's call is not given to tenant
    b (it may carry a's companions' influence); within a tenant it is."""
    gated = Gated(embedder, shared=False)
    batcher = QueryBatcher(gated, max_batch=8)

    async def main() -> None:
        await batcher.query("the same words", "a")
        await batcher.query("the same words", "a")  # cached for a
        await batcher.query("the same words", "b")  # embedded again for b

    try:
        asyncio.run(main())
    finally:
        batcher.close()
    assert [texts for _, texts in gated.calls] == [["the same words"], ["the same words"]]
    assert batcher.cache.hits == 1


def test_batches_respect_the_bound(embedder):
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, max_batch=4)

    async def main() -> None:
        first = await parked(gated, batcher)
        rest = [asyncio.ensure_future(batcher.query(f"query {i}", "t")) for i in range(11)]
        await settle()
        gated.release()
        await asyncio.gather(first, *rest)

    try:
        asyncio.run(main())
    finally:
        batcher.close()
    sizes = [len(texts) for kind, texts in gated.calls if kind == "query"]
    assert sizes[0] == 1
    assert sizes[1:] == [4, 4, 3]


def test_waiting_recall_goes_before_queued_bulk_work(embedder):
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, max_batch=8, bulk_chunk=2, bulk_max_wait_s=3600)

    async def main() -> None:
        first = await parked(gated, batcher)
        bulk = asyncio.ensure_future(batcher.bulk([f"learned fact {i}" for i in range(6)]))
        await settle()
        queries = [asyncio.ensure_future(batcher.query(f"recall {i}", "t")) for i in range(3)]
        await settle()
        gated.release()
        await asyncio.gather(first, *queries)
        vectors = await bulk
        assert vectors.shape == (6, embedder.dim)

    try:
        asyncio.run(main())
    finally:
        batcher.close()
    kinds = [kind for kind, _ in gated.calls]
    assert kinds == ["query", "query", "bulk", "bulk", "bulk"]
    assert gated.calls[1][1] == ["recall 0", "recall 1", "recall 2"]


def test_recall_arriving_mid_bulk_job_runs_before_its_next_chunk(embedder):
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, bulk_chunk=2, bulk_max_wait_s=3600)

    async def main() -> None:
        gated.hold()
        bulk = asyncio.ensure_future(batcher.bulk([f"learned fact {i}" for i in range(6)]))
        await asyncio.get_running_loop().run_in_executor(None, gated.entered.wait, 60)
        query = asyncio.ensure_future(batcher.query("what did I learn?", "t"))
        await settle()
        gated.release()
        await asyncio.gather(bulk, query)

    try:
        asyncio.run(main())
    finally:
        batcher.close()
    assert [kind for kind, _ in gated.calls] == ["bulk", "query", "bulk", "bulk"]


def test_a_flooding_tenant_does_not_crowd_others_out_of_a_batch(embedder):
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, max_batch=4)

    async def main() -> None:
        first = await parked(gated, batcher)
        flood = [asyncio.ensure_future(batcher.query(f"flood {i}", "flood")) for i in range(12)]
        await settle()
        quiet = [asyncio.ensure_future(batcher.query(f"quiet {i}", "quiet")) for i in range(2)]
        other = asyncio.ensure_future(batcher.query("other 0", "other"))
        await settle()
        gated.release()
        await asyncio.gather(first, *flood, *quiet, other)

    try:
        asyncio.run(main())
    finally:
        batcher.close()
    batches = [texts for kind, texts in gated.calls if kind == "query"][1:]
    assert batches[0] == ["flood 0", "quiet 0", "other 0", "flood 1"]
    assert batches[1] == ["quiet 1", "flood 2", "flood 3", "flood 4"]
    assert all(len(b) == 4 for b in batches[:-1])


def test_one_tenant_per_call_still_takes_turns_with_a_flood(embedder):
    """Calls of one tenant each: the flood sends one call of at most max_batch, then the
    quiet tenants go, then the flood again; the predicted wait follows those turns."""
    gated = Gated(embedder, shared=False)
    batcher = QueryBatcher(gated, max_batch=4)

    async def main() -> tuple[float, float]:
        first = await parked(gated, batcher)
        flood = [asyncio.ensure_future(batcher.query(f"flood {i}", "flood")) for i in range(12)]
        await settle()
        quiet = [asyncio.ensure_future(batcher.query(f"quiet {i}", "quiet")) for i in range(2)]
        other = asyncio.ensure_future(batcher.query("other 0", "other"))
        await settle()
        batcher.seconds_per_text, batcher._measured_at = 0.01, time.monotonic()
        waits = batcher.expected_wait("other"), batcher.expected_wait("flood")
        gated.release()
        await asyncio.gather(first, *flood, *quiet, other)
        return waits

    try:
        other_wait, flood_wait = asyncio.run(main())
    finally:
        batcher.close()
    batches = [texts for kind, texts in gated.calls if kind == "query"][1:]
    assert batches == [
        ["flood 0", "flood 1", "flood 2", "flood 3"],
        ["quiet 0", "quiet 1"],
        ["other 0"],
        ["flood 4", "flood 5", "flood 6", "flood 7"],
        ["flood 8", "flood 9", "flood 10", "flood 11"],
    ]
    # (the parked call predicted nothing in progress: no cost was measured before it)
    # other's next query: behind one flood call (4), quiet's 2 and its own 1, then itself
    assert other_wait == pytest.approx((4 + 2 + 1 + 1) * 0.01, abs=0.005)
    # the flood's: behind its own 12 (3 turns), everyone else's 3, then itself
    assert flood_wait == pytest.approx((12 + 3 + 1) * 0.01, abs=0.005)


def test_cache_hits_and_least_recent_eviction(embedder):
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, cache_size=2)

    async def main() -> None:
        a = await batcher.query("alpha", "t")
        again = await batcher.query("alpha", "other tenant")  # same text, same model
        np.testing.assert_array_equal(a, again)
        await batcher.query("beta", "t")
        await batcher.query("alpha", "t")  # alpha is now the most recent
        await batcher.query("gamma", "t")  # evicts beta
        await batcher.query("alpha", "t")
        await batcher.query("beta", "t")

    try:
        asyncio.run(main())
    finally:
        batcher.close()
    embedded = [texts for _, texts in gated.calls]
    assert embedded == [["alpha"], ["beta"], ["gamma"], ["beta"]]
    assert batcher.cache.hits == 3
    assert len(batcher.cache) == 2


def test_a_cancelled_caller_neither_gets_embedded_nor_poisons_the_batch(embedder):
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, max_batch=8)

    async def main() -> None:
        first = await parked(gated, batcher)
        gone = asyncio.ensure_future(batcher.query("given up", "t"))
        kept = asyncio.ensure_future(batcher.query("still waiting", "t"))
        await settle()
        gone.cancel()  # as asyncio.wait_for does when the recall budget passes
        await settle()
        gated.release()
        await first
        vector = await kept
        np.testing.assert_allclose(vector, embedder.embed_queries(["still waiting"])[0], atol=1e-4)
        with pytest.raises(asyncio.CancelledError):
            await gone
        # cancelled while its batch runs: the others still get theirs
        gated.hold()
        running = [asyncio.ensure_future(batcher.query(f"in flight {i}", "t")) for i in range(3)]
        await asyncio.get_running_loop().run_in_executor(None, gated.entered.wait, 60)
        running[0].cancel()
        gated.release()
        results = await asyncio.gather(*running, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert all(isinstance(r, np.ndarray) for r in results[1:])

    try:
        asyncio.run(main())
    finally:
        batcher.close()
    embedded = [t for _, texts in gated.calls for t in texts]
    assert "given up" not in embedded and "still waiting" in embedded


def test_an_embedder_error_reaches_every_caller_of_the_batch(embedder):
    gated = Gated(embedder, fail_on="boom")
    batcher = QueryBatcher(gated, max_batch=8, bulk_chunk=2)

    async def main() -> None:
        first = await parked(gated, batcher)
        batch = [
            asyncio.ensure_future(batcher.query(text, "t"))
            for text in ("boom", "innocent one", "innocent two")
        ]
        await settle()
        gated.release()
        await first
        results = await asyncio.gather(*batch, return_exceptions=True)
        assert all(isinstance(r, ValueError) for r in results)
        with pytest.raises(ValueError):
            await batcher.bulk(["fine", "fine too", "boom"])
        assert (await batcher.query("after the error", "t")).shape == (embedder.dim,)

    try:
        asyncio.run(main())
    finally:
        batcher.close()
    assert "boom" not in [key[1] for key in batcher.cache._items]


def test_closed_batcher_refuses_new_work(embedder):
    batcher = QueryBatcher(embedder)
    batcher.close()
    with pytest.raises(RuntimeError):
        asyncio.run(batcher.query("late", "t"))


def test_a_long_query_does_not_pad_the_short_ones_in_its_batch(exact_embedder):
    embedder = exact_embedder  # batch-independent vectors: each must equal its text alone
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, max_batch=8)
    long_text = "a long pasted document about many things " * 40

    async def main() -> list[np.ndarray]:
        first = await parked(gated, batcher)
        tasks = [
            asyncio.ensure_future(batcher.query(t, "t"))
            for t in ("short one", long_text, "short two")
        ]
        await settle()
        gated.release()
        await first
        return await asyncio.gather(*tasks)

    try:
        got = asyncio.run(main())
    finally:
        batcher.close()
    assert gated.calls[1:] == [("query", ["short one", "short two"]), ("query", [long_text])]
    for text, vector in zip(("short one", long_text, "short two"), got, strict=True):
        np.testing.assert_allclose(vector, embedder.embed_queries([text])[0], atol=1e-4)


def test_bulk_work_gets_a_chunk_between_batches_once_it_has_waited_its_limit(embedder):
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, max_batch=2, bulk_chunk=2, bulk_max_wait_s=0.0)

    async def main() -> None:
        first = await parked(gated, batcher)
        bulk = asyncio.ensure_future(batcher.bulk([f"learned fact {i}" for i in range(4)]))
        await settle()
        queries = [asyncio.ensure_future(batcher.query(f"recall {i}", "t")) for i in range(4)]
        await settle()
        gated.release()
        await asyncio.gather(first, bulk, *queries)

    try:
        asyncio.run(main())
    finally:
        batcher.close()
    kinds = [kind for kind, _ in gated.calls]
    assert kinds == ["query", "bulk", "query", "bulk", "query"]


def test_identical_texts_in_flight_share_one_slot(embedder):
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, max_batch=2, cache_size=0)

    async def main() -> list[np.ndarray]:
        first = await parked(gated, batcher)
        same = [asyncio.ensure_future(batcher.query("same words", t)) for t in ("a", "b")]
        other = asyncio.ensure_future(batcher.query("other words", "c"))
        await settle()
        gated.release()
        await first
        return await asyncio.gather(*same, other)

    try:
        a, b, _other = asyncio.run(main())
    finally:
        batcher.close()
    batches = [sorted(texts) for kind, texts in gated.calls if kind == "query"][1:]
    assert batches == [["other words", "same words"]]  # one call: the twin took no slot
    assert batcher.shared_waits == 1
    np.testing.assert_array_equal(a, b)
    assert a is not b  # each caller owns its copy


def test_a_twin_whose_first_caller_gives_up_still_gets_its_vector(embedder):
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, cache_size=0)

    async def main() -> np.ndarray:
        first = await parked(gated, batcher)
        leader = asyncio.ensure_future(batcher.query("shared text", "a"))
        await settle()
        follower = asyncio.ensure_future(batcher.query("shared text", "b"))
        await settle()
        leader.cancel()  # its recall passed its budget
        await settle()
        gated.release()
        await first
        return await follower

    try:
        vector = asyncio.run(main())
    finally:
        batcher.close()
    np.testing.assert_allclose(vector, embedder.embed_queries(["shared text"])[0], atol=1e-4)


def test_expected_wait_follows_the_queue_a_tenant_is_behind(embedder):
    gated = Gated(embedder)
    batcher = QueryBatcher(gated, max_batch=8)

    async def main() -> tuple[float, float, float, float]:
        unmeasured = batcher.expected_wait("flood")
        await batcher.query("a first query is measured", "x")
        first = await parked(gated, batcher)
        flood = [asyncio.ensure_future(batcher.query(f"flood {i}", "flood")) for i in range(6)]
        await settle()
        flood_wait = batcher.expected_wait("flood")
        quiet_wait = batcher.expected_wait("quiet")
        per_text = batcher.seconds_per_text
        gated.release()
        await asyncio.gather(first, *flood)
        return unmeasured, flood_wait, quiet_wait, per_text

    try:
        unmeasured, flood_wait, quiet_wait, per_text = asyncio.run(main())
    finally:
        batcher.close()
    assert unmeasured == 0.0  # nothing measured yet: no prediction
    assert per_text > 0
    # the flood's next query is behind its own 6; a quiet tenant's behind one of them
    assert flood_wait >= 7 * per_text
    assert quiet_wait <= 2 * per_text + (flood_wait - 7 * per_text) + 1e-9
    assert flood_wait - quiet_wait == pytest.approx(5 * per_text, rel=0.05)


def test_a_stale_cost_estimate_stops_predicting_until_measured_again(embedder, monkeypatch):
    """One slow batch (a stall) must not make every later recall text-only forever: a
    text-only recall embeds nothing, so only letting a query through re-measures."""
    import memory_core.query_batcher as module

    batcher = QueryBatcher(embedder, max_batch=8)

    async def main() -> tuple[float, float, float]:
        await batcher.query("a first query is measured", "x")
        batcher.seconds_per_text = 10.0  # as if that batch had stalled
        fresh = batcher.expected_wait("x")
        monkeypatch.setattr(module, "COST_STALE_S", 0.0)  # ...and a while has passed
        stale = batcher.expected_wait("x")
        await batcher.query("the next query is embedded and measured", "x")
        monkeypatch.setattr(module, "COST_STALE_S", 60.0)
        return fresh, stale, batcher.expected_wait("x")

    try:
        fresh, stale, remeasured = asyncio.run(main())
    finally:
        batcher.close()
    assert fresh >= 10.0  # a fresh estimate predicts
    assert stale == 0.0  # a stale one does not (nothing queued or running)
    assert 0 < remeasured < 10.0  # the new batch pulled the estimate down
