"""Postgres full-text ranking: BM25 whose statistics (N, document frequencies, average
length) count only the tenant's active memories in the spaces the request may read
(memory_core/postgres/text_stats.py)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import pytest

from memory_core import NewMemory, RecallQuery
from memory_core.bm25 import K1, B
from memory_core.postgres.store import TEXT_KEY, PostgresStore

QUERY = "alpha beta"
ALPHA = "The alpha memo is due on Monday"


def _base() -> list[NewMemory]:
    """In this set "alpha" is the rare word (1 memory), "beta" the commoner one (5)."""
    betas = [NewMemory(f"The beta memo number {i} is due") for i in range(5)]
    fillers = [NewMemory(f"Lunch order {i} arrives at noon") for i in range(24)]
    return [NewMemory(ALPHA), *betas, *fillers]


@pytest.fixture
def pg(pg_server: Any, embedder: Any) -> Iterator[tuple[PostgresStore, Any]]:
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(PostgresStore.open(pg_server.new_database(), embedder))
    yield store, loop.run_until_complete
    loop.run_until_complete(store.close())
    loop.close()


def _scores(pg: Any, tenant: str, query: str = QUERY, spaces: Any = ("default",)) -> list:
    """(content, text score) of the text side's hits, best first."""
    store, run = pg
    q = RecallQuery(tenant, list(spaces), query, top_k=40, use_vector=False)
    return [(r.memory.content, r.breakdown[TEXT_KEY]) for r in run(store.recall(q))]


def test_another_tenants_flood_changes_neither_order_nor_scores(pg):
    """300 memories saying "alpha" in tenant b: counted over the whole table "alpha"
    would be the common word and a's five beta memos would outrank its alpha memo."""
    store, run = pg
    run(store.add_many("a", "default", _base()))
    before = _scores(pg, "a")
    assert before[0][0] == ALPHA
    flood = [NewMemory(f"Alpha memo {i} about the alpha project") for i in range(300)]
    run(store.add_many("b", "default", flood))
    store._scope_stats = type(store._scope_stats)()  # no cached count hides a leak
    assert _scores(pg, "a") == before


def test_a_rare_term_outranks_a_common_one(pg):
    """ts_rank, with no IDF, put the memos saying "beta" twice first; BM25 puts the one
    memo with the rare "alpha" first."""
    store, run = pg
    betas = [NewMemory(f"Beta beta memo number {i}") for i in range(10)]
    run(store.add_many("a", "default", [NewMemory("Alpha memo number 99"), *betas]))
    ranked = _scores(pg, "a")
    assert ranked[0][0] == "Alpha memo number 99"
    assert ranked[0][1] > ranked[1][1]


def test_inactive_memories_do_not_count(pg):
    """Tenant a holds the base set plus 20 more "alpha" memories, half forgotten, half
    superseded; its scores must equal those of tenant r, which holds the base set only."""
    store, run = pg
    run(store.add_many("r", "default", _base()))
    base = run(store.add_many("a", "default", _base()))
    extra = run(
        store.add_many("a", "default", [NewMemory(f"Alpha draft {i} to drop") for i in range(20)])
    )
    for memory in extra[:10]:
        run(store.forget("a", memory.id, "test"))
    for memory in extra[10:]:
        run(store.supersede("a", memory.id, base[-1].id, "test"))
    assert _scores(pg, "a") == _scores(pg, "r")


def test_spaces_the_request_cannot_read_do_not_count(pg):
    """Tenant a's space "other" holds 300 "alpha" memories; a recall reading "default"
    only must score as tenant r, which holds the base set only."""
    store, run = pg
    run(store.add_many("r", "default", _base()))
    run(store.add_many("a", "default", _base()))
    flood = [NewMemory(f"Alpha memo {i} about the alpha project") for i in range(300)]
    run(store.add_many("a", "other", flood))
    assert _scores(pg, "a") == _scores(pg, "r")
    both = _scores(pg, "a", spaces=("default", "other"))
    assert [content for content, _ in both][:5] != [content for content, _ in _scores(pg, "r")][:5]


def test_scores_are_fts5s_bm25_over_the_tenant(pg):
    """The formula itself: FTS5's IDF with its clamp, the shared k1 and b
    (memory_core/bm25.py), the length being the memory's last token position (stop words
    count, as in FTS5)."""
    store, run = pg
    texts = ["Alpha beta gamma", "Beta beta delta and the rest", "Alpha"]
    texts += [f"Lunch at noon {i}" for i in range(7)]
    run(store.add_many("a", "default", [NewMemory(t) for t in texts]))
    lengths = [3, 6, 1] + [4] * 7  # positions: stop words ("and", "the", "at") take one
    average = sum(lengths) / len(lengths)
    frequencies = [{"alpha": 1, "beta": 1}, {"beta": 2}, {"alpha": 1}] + [{}] * 7
    df = {"alpha": 2, "beta": 2}

    def idf(term: str) -> float:
        return max(math.log((10 - df[term] + 0.5) / (df[term] + 0.5)), 1e-6)

    expected = {}
    for text, length, tf in zip(texts, lengths, frequencies, strict=True):
        norm = K1 * (1 - B + B * length / average)
        score = sum(idf(t) * f * (K1 + 1) / (f + norm) for t, f in tf.items())
        if tf:
            expected[text] = round(score, 4)
    assert min(expected.values()) > 0.5
    assert dict(_scores(pg, "a")) == pytest.approx(expected, abs=1e-4)
