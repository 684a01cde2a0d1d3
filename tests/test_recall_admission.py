"""Recall admission: a bounded number of recalls work at once, the rest wait their turn
(round-robin by tenant, bounded), and the recall budget starts at admission."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from memory_core import SQLiteStore
from proxy.memory.admission import AdmissionTimeout, RecallGate
from tests.test_recall_text_only import FACT, SlowQueries, chat


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_at_most_capacity_run_and_a_quiet_tenant_goes_before_the_flood_backlog():
    async def main() -> None:
        gate = RecallGate(capacity=2, max_wait=10)
        release = asyncio.Event()
        running: list[str] = []

        async def work(name: str) -> str:
            running.append(name)
            await release.wait()
            return name

        flood = [
            asyncio.ensure_future(gate.run("flood", lambda n=f"flood{i}": work(n)))
            for i in range(5)
        ]
        await _settle()
        assert running == ["flood0", "flood1"]  # capacity 2: three flood recalls wait
        quiet = asyncio.ensure_future(gate.run("quiet", lambda: work("quiet")))
        await _settle()
        assert gate.waiting == 4
        release.set()
        results = await asyncio.gather(*flood, quiet)
        # The quiet tenant's one recall takes the first free slot, ahead of the flood's
        # older backlog (the flood already has recalls working), not after all of it.
        assert running.index("quiet") == 2
        assert [r for r, _ in results] == [f"flood{i}" for i in range(5)] + ["quiet"]
        assert gate.running == 0 and gate.waiting == 0

    asyncio.run(main())


def test_a_recall_not_admitted_in_time_gives_up_having_cost_nothing():
    async def main() -> None:
        gate = RecallGate(capacity=1, max_wait=0.05)
        release = asyncio.Event()
        started: list[int] = []

        async def work(i: int) -> int:
            started.append(i)
            await release.wait()
            return i

        first = asyncio.ensure_future(gate.run("t", lambda: work(1)))
        await _settle()
        with pytest.raises(AdmissionTimeout) as raised:
            await gate.run("t", lambda: work(2))
        assert raised.value.waited >= 0.05
        assert gate.waiting == 0  # the abandoned waiter left the queue
        third = asyncio.ensure_future(gate.run("t", lambda: work(3)))
        await _settle()
        release.set()
        assert [r for r, _ in await asyncio.gather(first, third)] == [1, 3]
        assert started == [1, 3]  # the abandoned recall never reached the store
        assert gate.running == 0

    asyncio.run(main())


def test_a_cancelled_waiter_leaks_no_slot_and_cancellation_is_not_a_timeout():
    async def main() -> None:
        gate = RecallGate(capacity=1, max_wait=10)
        release = asyncio.Event()

        async def work() -> None:
            await release.wait()

        first = asyncio.ensure_future(gate.run("t", work))
        await _settle()
        waiter = asyncio.ensure_future(gate.run("t", work))  # the client goes away
        await _settle()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        release.set()
        await first
        assert gate.running == 0 and gate.waiting == 0
        _, waited = await gate.run("t", work)  # the slot is free again at once
        assert waited < 1

    asyncio.run(main())


def test_a_failing_recall_frees_its_slot():
    async def main() -> None:
        gate = RecallGate(capacity=1, max_wait=10)

        async def boom() -> None:
            raise RuntimeError("store down")

        with pytest.raises(RuntimeError):
            await gate.run("t", boom)
        assert gate.running == 0

        async def fine() -> str:
            return "ok"

        assert (await gate.run("t", fine))[0] == "ok"

    asyncio.run(main())


def test_queued_recalls_keep_their_whole_budget_and_inject(memory_proxy, embedder):
    """Three recalls of 0.8 s each, one at a time, budget 2 s: the third waits about
    1.6 s for its turn. Counting the wait against the budget (the old behaviour) would
    answer it without memories; with admission every answer carries the memory, and the
    wait is reported."""
    slow = SlowQueries(embedder, delay=0.8)
    server, seed = memory_proxy(
        store_class=lambda db, _e: SQLiteStore(db, slow),
        recall_budget_ms=2000,
        recall_concurrency=1,
        recall_queue_ms=30_000,
        recall_vector_share=1.0,  # never fall back to text only: the vector must be waited for
    )
    seed.add("acme", "default", FACT)

    with ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(lambda n: chat(server, n), range(3)))
    statuses = [r.headers["x-memrelay-recall-status"] for r in responses]
    assert statuses == ["ok", "ok", "ok"]
    waits = sorted(float(r.headers["x-memrelay-recall-wait-ms"]) for r in responses)
    assert waits[-1] >= 800  # the last one waited at least one whole recall for its turn
    for response in responses:
        assert int(response.headers["x-memrelay-recalled"]) >= 1


def test_a_recall_that_cannot_get_a_turn_in_time_goes_without_memories(memory_proxy, embedder):
    slow = SlowQueries(embedder, delay=1.5)
    server, seed = memory_proxy(
        store_class=lambda db, _e: SQLiteStore(db, slow),
        recall_budget_ms=5000,
        recall_concurrency=1,
        recall_queue_ms=100,
        recall_vector_share=1.0,
    )
    seed.add("acme", "default", FACT)

    with ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(lambda n: chat(server, n), range(2)))
    statuses = sorted(r.headers["x-memrelay-recall-status"] for r in responses)
    assert statuses == ["ok", "timeout"]  # one worked; the other gave up waiting
    for response in responses:
        assert response.parse().choices  # both answered
