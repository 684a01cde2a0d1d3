"""Full-text ranking counts each tenant's own memories: another tenant's data never
changes it (both backends compute BM25 over the tenant's statistics with the constants
of memory_core/bm25.py, see also test_postgres_text_ranking.py)."""

from __future__ import annotations

import pytest

from memory_core import NewMemory, RecallQuery, bm25
from memory_core.recall import POSTINGS_BUDGET
from memory_core.sqlite.tenant_bm25 import scored_hits

QUERY = "alpha beta report"
RARE_IN_A = "The alpha report is due on the first of the month"


def _a_memories() -> list[NewMemory]:
    beta = [
        NewMemory(f"The beta report number {i} is due on the first of the month") for i in range(10)
    ]
    return [NewMemory(RARE_IN_A), *beta]


def _text_order(store, run) -> list[str]:
    results = run(store.recall(RecallQuery("a", ["default"], QUERY, top_k=11, use_vector=False)))
    return [r.memory.content for r in results]


def test_another_tenants_flood_does_not_reorder_a_tenants_text_ranking(store, run):
    """In tenant a, "alpha" is the rare word: its memory ranks first. Tenant b then
    stores 300 memories saying "alpha"; counted over the whole index "beta" would become
    the rare word and a's ten beta memories would outrank it."""
    run(store.add_many("a", "default", _a_memories()))
    before = _text_order(store, run)
    assert before[0] == RARE_IN_A
    flood = [NewMemory(f"Alpha memo {i} about the alpha project report") for i in range(300)]
    run(store.add_many("b", "default", flood))
    after = _text_order(store, run)
    assert after == before


@pytest.mark.parametrize("store", ["vector-cache", "vec0-knn"], indirect=True)
def test_one_tenant_scores_equal_fts5s_own(store, run):
    """With one tenant in one space the tenant's statistics are the index's: the scorer
    run with FTS5's k1 and b must give exactly FTS5's bm25 (this checks the row count,
    the IDF and the lengths read from the per-scope tables)."""
    run(store.add_many("a", "default", _a_memories()))
    terms = ["alpha", "beta", "report"]

    def both(conn):
        found = scored_hits(
            conn, "a", ["default"], terms, 20, POSTINGS_BUDGET, k1=bm25.FTS5_K1, b=bm25.FTS5_B
        )
        ours = dict(found)
        match = '"alpha" OR "beta" OR "report"'
        theirs = dict(
            conn.execute(
                "SELECT rowid, bm25(memory_fts) FROM memory_fts WHERE memory_fts MATCH ?",
                [match],
            ).fetchall()
        )
        count = conn.execute("SELECT count(*) FROM memory_fts").fetchone()[0]
        return ours, theirs, count

    ours, theirs, count = run(store.run_read(both))
    assert count == 11
    assert set(ours) == set(theirs)
    for rowid, score in theirs.items():
        assert ours[rowid] == pytest.approx(score, rel=1e-9)


def _vectors(store, count: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, store.embedder.dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _text_only(store, run, tenant: str, text: str, top_k: int = 5) -> list[str]:
    query = RecallQuery(tenant, ["default"], text, top_k=top_k, use_vector=False)
    return [r.memory.content for r in run(store.recall(query))]


@pytest.mark.parametrize("store", ["vector-cache"], indirect=True)
def test_another_tenants_long_documents_do_not_change_a_tenants_scores(store, run):
    """BM25 divides a term's frequency by the document's length relative to the average
    length. Tenant a holds short memories; tenant b then stores long ones. Averaged over
    the whole index, a's memories would all look short: their scores would change (and,
    with b near 1, a's long memory saying "alpha" twice would overtake the short one)."""
    short = "Alpha note today"
    long = "Alpha alpha " + " ".join(f"word{i}" for i in range(18))
    fillers = [f"Quiet filler memo number {i} here" for i in range(8)]
    items = [NewMemory(t) for t in (short, long, *fillers)]
    run(store.add_embedded("a", "default", items, _vectors(store, len(items), 1)))
    query = RecallQuery("a", ["default"], "alpha", top_k=5, use_vector=False)

    def scores() -> list[tuple[str, float]]:
        return [(r.memory.content, r.breakdown["text_bm25"]) for r in run(store.recall(query))]

    before = scores()
    assert {content for content, _ in before} == {short, long}
    words = " ".join(f"lorem{i}" for i in range(300))
    flood = [NewMemory(f"Memo {i}: {words}") for i in range(100)]
    run(store.add_embedded("b", "default", flood, _vectors(store, len(flood), 2)))
    assert scores() == before


@pytest.mark.parametrize("store", ["vector-cache"], indirect=True)
def test_the_postings_budget_counts_the_tenants_own_postings(store, run):
    """A word past the postings budget in tenant b (too costly to score there, left to
    the vectors) is rare in tenant a and still ranks a's memory; counted over the whole
    index it would be skipped for a too."""
    from memory_core.recall import POSTINGS_BUDGET

    count = POSTINGS_BUDGET + 100
    flood = [NewMemory(f"Heron sighting number {i}") for i in range(count)]
    run(store.add_embedded("b", "default", flood, _vectors(store, count, 3)))
    rare = "The heron nests by the lake"
    items = [NewMemory(rare), NewMemory("The lake is cold in March")]
    run(store.add_embedded("a", "default", items, _vectors(store, len(items), 4)))
    assert _text_only(store, run, "a", "heron") == [rare]
    assert _text_only(store, run, "b", "heron") == []  # common in b: not scored there


@pytest.mark.parametrize("store", ["vector-cache"], indirect=True)
def test_an_older_database_is_migrated_with_the_same_scores(store, run, tmp_path, embedder):
    """A database made before the per-scope tables (schema 4) gets them filled from its
    active memories when opened: the scores are the same as when written live."""
    from memory_core.sqlite.db import connect
    from memory_core.sqlite.schema import MIGRATIONS
    from memory_core.sqlite.store import SQLiteStore
    from memory_core.sqlite.text_index import TABLES

    run(store.add_many("a", "default", _a_memories()))
    run(store.add_many("a", "work", [NewMemory("The alpha beta plan for work")]))
    gone = run(store.add("a", "default", NewMemory("An alpha report to forget")))
    run(store.forget("a", gone.id, "test"))
    query = RecallQuery("a", ["default", "work"], QUERY, top_k=20, use_vector=False)
    live = [(r.memory.id, r.breakdown["text_bm25"]) for r in run(store.recall(query))]
    run(store.close())
    conn = connect(store.path)
    for statement in TABLES:
        conn.execute(f"DROP TABLE {statement.split()[2]}")
    conn.execute("DROP INDEX jobs_tenant_order")  # and what schema 6 added
    conn.execute("ALTER TABLE jobs DROP COLUMN forgets")
    conn.execute("UPDATE schema_version SET version = 4")
    conn.close()
    reopened = run(SQLiteStore.open(store.path, embedder))
    try:
        assert reopened.schema_version == len(MIGRATIONS)
        again = [(r.memory.id, r.breakdown["text_bm25"]) for r in run(reopened.recall(query))]
    finally:
        run(reopened.close())
    assert len(live) == 12
    assert again == live


def test_both_backends_score_with_the_shared_constants(store, run):
    """Every backend's recall scores BM25 with memory_core/bm25.py's k1 and b (one
    definition, so SQLite and Postgres cannot drift): the breakdown's score is the
    formula computed here with those constants, and measurably not with FTS5's."""
    texts = ["Alpha beta gamma", "Beta beta delta and the rest of days", "Alpha"]
    texts += [f"Lunch at noon {i}" for i in range(7)]
    run(store.add_many("a", "default", [NewMemory(t) for t in texts]))
    lengths = [3, 8, 1] + [4] * 7  # tokens, inner stop words included (as both backends count)
    average = sum(lengths) / len(lengths)
    frequencies = [{"alpha": 1, "beta": 1}, {"beta": 2}, {"alpha": 1}]

    def expected(k1: float, b: float) -> dict[str, float]:
        out = {}
        for text, length, tf in zip(texts, lengths, frequencies, strict=False):
            norm = k1 * (1 - b + b * length / average)
            idf = bm25.idf(len(texts), 2)  # alpha and beta: two memories each
            out[text] = round(sum(idf * f * (k1 + 1) / (f + norm) for f in tf.values()), 4)
        return out

    ours = expected(bm25.K1, bm25.B)
    fts5 = expected(bm25.FTS5_K1, bm25.FTS5_B)
    assert max(abs(ours[t] - fts5[t]) for t in ours) > 0.01  # the check tells them apart
    query = RecallQuery("a", ["default"], "alpha beta", top_k=10, use_vector=False)
    found = {r.memory.content: r.breakdown["text_bm25"] for r in run(store.recall(query))}
    assert found == pytest.approx(ours, abs=2e-4)
