"""Full-text ranking counts each tenant's own memories: another tenant's data never
changes it (SQLite re-weighs FTS5's scores with the tenant's IDF; Postgres computes
BM25 over the tenant's statistics, see also test_postgres_text_ranking.py)."""

from __future__ import annotations

import pytest

from memory_core import NewMemory, RecallQuery
from memory_core.recall import text_search
from memory_core.sqlite.tenant_bm25 import _varint, index_rows

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
    """With one tenant in one space the tenant's IDF is the index's: the re-weighed
    score must be exactly FTS5's bm25 (this checks the row count read from the index)."""
    run(store.add_many("a", "default", _a_memories()))
    query = RecallQuery("a", ["default"], QUERY, top_k=20)

    def both(conn):
        ours = dict(text_search(conn, query, ["alpha", "beta", "report"], 20))
        match = '"alpha" OR "beta" OR "report"'
        theirs = dict(
            conn.execute(
                "SELECT rowid, bm25(memory_fts) FROM memory_fts WHERE memory_fts MATCH ?",
                [match],
            ).fetchall()
        )
        count = conn.execute("SELECT count(*) FROM memory_fts").fetchone()[0]
        return ours, theirs, count, index_rows(conn)

    ours, theirs, count, rows = run(store.run_read(both))
    assert rows == count == 11
    assert set(ours) == set(theirs)
    for rowid, score in theirs.items():
        assert ours[rowid] == pytest.approx(score, rel=1e-9)


def test_varint_reads_sqlite_varints():
    assert _varint(bytes([0x05])) == (5, 1)
    assert _varint(bytes([0x81, 0x00])) == (128, 2)
    assert _varint(bytes([0xFF] * 8 + [0x01]))[0] == (2**56 - 1) << 8 | 1
