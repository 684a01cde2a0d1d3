"""Common terms' full-text matches are kept between recalls, and never outlive a write:
a forgotten memory is never found from the cache, a new one is found at once, and a
write by another tenant (which moves the shared index statistics) invalidates too."""

from __future__ import annotations

import pytest

from memory_core import NewMemory, RecallQuery
from memory_core.sqlite.tenant_bm25 import TermHits

COMMON = TermHits.MIN_MATCHES + 20  # enough matches for the term to be kept


def _text(store, run, text: str = "alpha") -> list[str]:
    query = RecallQuery("a", ["default"], text, top_k=10, use_vector=False)
    return [r.memory.content for r in run(store.recall(query))]


def _seed(store, run) -> list:
    filler = [NewMemory(f"Alpha note number {i} about the weekly plan") for i in range(COMMON)]
    strong = NewMemory("Alpha alpha alpha: the alpha launch code word is heron")
    return run(store.add_many("a", "default", [strong, *filler]))


@pytest.mark.parametrize("store", ["vector-cache", "vec0-knn"], indirect=True)
def test_a_forgotten_memory_is_never_served_from_the_cache(store, run):
    memories = _seed(store, run)
    first = _text(store, run)
    assert first[0].startswith("Alpha alpha alpha")
    assert len(store._term_hits) >= 1  # the term was kept: the next recall reads the cache
    run(store.forget("a", memories[0].id, "user asked"))
    after = _text(store, run)
    assert not any("heron" in content for content in after)
    assert len(after) == 10  # the rest still found


@pytest.mark.parametrize("store", ["vector-cache", "vec0-knn"], indirect=True)
def test_a_new_memory_is_found_at_once(store, run):
    _seed(store, run)
    _text(store, run)
    assert len(store._term_hits) >= 1
    run(store.add("a", "default", NewMemory("ALPHA alpha alpha alpha alpha: the vault is blue")))
    assert _text(store, run)[0].startswith("ALPHA alpha alpha alpha alpha")


@pytest.mark.parametrize("store", ["vector-cache"], indirect=True)
def test_another_tenants_write_invalidates_the_shared_statistics(store, run):
    """FTS5's scores carry the whole index's IDF and average length: after tenant b
    writes, a's scores must be the ones computed fresh, not the cached ones."""
    _seed(store, run)
    others = [NewMemory(f"Gamma memo {i} on the quarterly budget") for i in range(300)]
    run(store.add_many("a", "default", others))  # "alpha" is not in every row: its IDF is > 0
    query = RecallQuery("a", ["default"], "alpha", top_k=5, use_vector=False)
    before = [r.breakdown.get("text_bm25") for r in run(store.recall(query))]
    run(store.add_many("b", "default", [NewMemory(f"Delta memo {i}") for i in range(300)]))
    cached = [r.breakdown.get("text_bm25") for r in run(store.recall(query))]
    store._term_hits = TermHits()  # nothing kept: computed fresh
    fresh = [r.breakdown.get("text_bm25") for r in run(store.recall(query))]
    assert fresh != before  # b's rows moved the index's IDF of "alpha"
    assert cached == fresh
