"""Common terms' full-text postings are kept between recalls, and never outlive a write
of their tenant: a forgotten memory is never found from the cache, a new one is found at
once, and the tenant's statistics (document count, average length) are always current.
Another tenant's write changes nothing: no statistic is shared."""

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
def test_scores_follow_the_tenants_own_writes_only(store, run):
    """Tenant a's scores of "alpha" move when a stores memories without it (more
    documents, another average length), and then equal the ones computed fresh; tenant
    b's writes leave them and the cached postings as they were."""
    _seed(store, run)
    query = RecallQuery("a", ["default"], "alpha", top_k=5, use_vector=False)

    def scores() -> list[float]:
        return [r.breakdown.get("text_bm25") for r in run(store.recall(query))]

    before = scores()
    assert len(store._term_hits) == 1
    others = [NewMemory(f"Gamma memo {i} on the quarterly budget") for i in range(300)]
    run(store.add_many("a", "default", others))
    cached = scores()
    store._term_hits = TermHits()  # nothing kept: computed fresh
    fresh = scores()
    assert fresh != before  # a's own rows moved its IDF of "alpha" and its average length
    assert cached == fresh
    kept = store._term_hits
    run(store.add_many("b", "default", [NewMemory(f"Alpha memo {i} and more") for i in range(300)]))
    assert scores() == fresh
    assert store._term_hits is kept and len(kept) == 1  # a's key (its events head) stayed
