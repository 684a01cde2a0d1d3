"""The four invariants of memory_core, each pinned so that removing its guard fails a test."""

from __future__ import annotations

import random
import uuid

import numpy as np
import pytest

from memory_core import ListQuery, NewMemory, RecallQuery
from memory_core.sqlite.db import connect

TOPICS = [
    "coffee",
    "hiking",
    "python code",
    "tax forms",
    "email tone",
    "birthday party",
    "database backup",
    "guitar lessons",
]


def test_recall_sql_excludes_inactive_even_with_a_stale_index(store, run):
    """Invariant 1: status is checked in the recall SQL itself, not only by unindexing."""
    live = run(store.add("acme", "default", NewMemory("The office wifi password is in the vault")))
    old = run(store.add("acme", "default", NewMemory("The office wifi password is on the fridge")))
    gone = run(store.add("acme", "default", NewMemory("The office wifi password is sunflower")))
    run(store.supersede("acme", old.id, live.id, "moved"))
    run(store.forget("acme", gone.id, "secret"))
    # Simulate an index that fell out of step: put the inactive rows back in both indexes.
    vector = store.embedder.embed(["The office wifi password"])[0]
    stale = ((old.id, "fridge wifi password"), (gone.id, "sunflower wifi password"))
    if store.backend == "postgres":
        _reindex_inactive_postgres(store.location, vector, stale)
    else:
        _reindex_inactive_sqlite(store.location, vector, stale)
    results = run(store.recall(RecallQuery("acme", ["default"], "wifi password fridge sunflower")))
    assert [r.memory.id for r in results] == [live.id]
    assert [m.id for m in run(store.list(ListQuery("acme"))).items] == [live.id]
    everything = run(store.list(ListQuery("acme", statuses=None))).items
    assert {m.status for m in everything} == {"active", "superseded", "forgotten"}


def _reindex_inactive_postgres(url, vector, stale) -> None:
    """Drop the CHECK that forbids it, then give inactive rows a vector and text again."""
    import psycopg
    from pgvector.psycopg import register_vector

    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        conn.execute("ALTER TABLE memories DROP CONSTRAINT only_active_indexed")
        for memory_id, text in stale:
            conn.execute(
                "UPDATE memories SET embedding = %s, tsv = to_tsvector('english', %s)"
                " WHERE id = %s",
                (np.asarray(vector, np.float32), text, memory_id),
            )


def _reindex_inactive_sqlite(path, vector, stale) -> None:
    conn = connect(path)
    for memory_id, text in stale:
        rowid = conn.execute("SELECT rowid FROM memories WHERE id = ?", (memory_id,)).fetchone()[0]
        conn.execute(
            "INSERT INTO memory_vec (rowid, tenant, space, kind, embedding) VALUES (?,?,?,?,?)",
            (rowid, "acme", "default", "fact", np.asarray(vector, np.float32).tobytes()),
        )
        conn.execute(
            "INSERT INTO memory_fts (rowid, content) VALUES (?,?)",
            (rowid, text),
        )
    conn.close()


def test_tenant_isolation_randomised(store, run):
    """Invariant 2: no call for one tenant returns, counts or scores another tenant's memory."""
    rng = random.Random(1234)
    tenants = [f"t{i}" for i in range(6)]
    spaces = ["default", "work", "home"]
    owner: dict[str, tuple[str, str]] = {}
    for tenant in tenants:
        for space in spaces:
            # Every tenant gets the same sentences: only the scope tells them apart.
            items = [
                NewMemory(f"The user talks about {topic} ({tenant} {space})") for topic in TOPICS
            ]
            items += [
                NewMemory(f"Shared sentence about {topic}") for topic in rng.sample(TOPICS, 3)
            ]
            for memory in run(store.add_many(tenant, space, items)):
                owner[memory.id] = (tenant, space)
    counts = {t: run(store.stats(t))["total"] for t in tenants}
    assert all(count == 3 * 11 for count in counts.values())
    for _ in range(150):
        tenant = rng.choice(tenants)
        read = rng.sample(spaces, rng.randint(1, 3))
        query = rng.choice([*TOPICS, "shared sentence", f"({rng.choice(tenants)} work)", "user"])
        results = run(store.recall(RecallQuery(tenant, read, query, top_k=rng.randint(1, 30))))
        assert results, query
        for result in results:
            assert result.memory.tenant == tenant
            assert owner[result.memory.id] == (tenant, result.memory.space)
            assert result.memory.space in read
        listed = run(store.list(ListQuery(tenant, spaces=read, limit=1000))).items
        assert {owner[m.id] for m in listed} <= {(tenant, s) for s in read}
        assert len(listed) == 11 * len(read)
    foreign = next(i for i, (t, _) in owner.items() if t == "t1")
    # A stale index row filed under t0 but pointing at t1's memory must not leak either.
    if store.backend == "postgres":
        import psycopg

        with psycopg.connect(store.location, autocommit=True) as pg:
            pg.execute(
                "UPDATE memories SET tsv = to_tsvector('english', 'leakcheck marker')"
                " WHERE id = %s",
                (foreign,),
            )
    else:
        conn = connect(store.path)
        rowid = conn.execute("SELECT rowid FROM memories WHERE id = ?", (foreign,)).fetchone()[0]
        conn.execute("DELETE FROM memory_fts WHERE rowid = ?", (rowid,))
        conn.execute(
            "INSERT INTO memory_fts (rowid, content) VALUES (?,?)", (rowid, "leakcheck marker")
        )
        conn.close()
    probe = run(store.recall(RecallQuery("t0", ["default"], "leakcheck marker")))
    assert foreign not in [r.memory.id for r in probe]
    assert run(store.get("t0", foreign)) is None
    assert run(store.history("t0", foreign)) == []
    assert all(e.tenant == "t0" for e in run(store.events("t0", limit=1000)))


def test_forget_erases_everywhere_in_the_file(store, run):
    """Invariant 3: after forget and a checkpoint the text is nowhere in the file or WAL."""
    marker = "zebracorn" + uuid.uuid4().hex[:12]
    memory = run(
        store.add(
            "acme",
            "default",
            NewMemory(
                f"The user's locker code is {marker}",
                subject="locker",
                attribute="code",
                value=marker,
                provenance={"note": marker},
                entities=[marker],
            ),
        )
    )
    run(store.add_many("acme", "default", [NewMemory(f"Filler fact {i}") for i in range(50)]))
    run(store.reinforce("acme", memory.id, {"note": marker}))
    if store.backend == "postgres":
        _forgotten_everywhere_in_postgres(store, run, memory, marker)
        return
    run(store.checkpoint())
    raw = store.path.read_bytes()
    assert marker.encode() in raw  # the test can see the text while it is remembered
    run(store.forget("acme", memory.id, "user asked"))
    run(store.checkpoint())
    wal = store.path.with_name(store.path.name + "-wal")
    for path in (store.path, wal):
        if path.exists():
            assert marker.encode() not in path.read_bytes(), path
    conn = connect(store.path)
    rowid = conn.execute("SELECT rowid FROM memories WHERE id = ?", (memory.id,)).fetchone()[0]
    assert (
        conn.execute("SELECT count(*) FROM memory_vec WHERE rowid = ?", (rowid,)).fetchone()[0] == 0
    )
    assert (
        conn.execute("SELECT count(*) FROM memory_fts WHERE rowid = ?", (rowid,)).fetchone()[0] == 0
    )
    assert (
        conn.execute(
            "SELECT count(*) FROM events WHERE detail LIKE ?", (f"%{marker}%",)
        ).fetchone()[0]
        == 0
    )
    conn.close()
    hits = run(store.recall(RecallQuery("acme", ["default"], f"locker code {marker}")))
    assert memory.id not in [h.memory.id for h in hits]


def _forgotten_everywhere_in_postgres(store, run, memory, marker) -> None:
    """Postgres: no table row, vector or text-search vector holds the text any more.

    (Old row versions stay in the heap until VACUUM and in the WAL until it is recycled;
    the README says so. What SQL, the indexes and recall can reach is checked here.)
    """
    import psycopg

    def holding_marker(conn) -> list[str]:
        found = []
        for table in ("memories", "events", "jobs"):
            count = conn.execute(
                f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s", (f"%{marker}%",)
            ).fetchone()[0]
            found += [table] * count
        return found

    with psycopg.connect(store.location, autocommit=True) as conn:
        assert holding_marker(conn) == ["memories"]  # visible while remembered
        run(store.forget("acme", memory.id, "user asked"))
        assert holding_marker(conn) == []
        embedding, tsv = conn.execute(
            "SELECT embedding, tsv FROM memories WHERE id = %s", (memory.id,)
        ).fetchone()
        assert embedding is None and tsv is None
    hits = run(store.recall(RecallQuery("acme", ["default"], f"locker code {marker}")))
    assert memory.id not in [h.memory.id for h in hits]


def test_every_change_appends_one_event_in_the_same_transaction(store, run):
    """Invariant 4: the ledger explains every state; a failed change leaves no event."""
    a = run(store.add("acme", "default", NewMemory("Alpha")))
    b = run(store.add("acme", "default", NewMemory("Beta")))
    run(store.reinforce("acme", a.id))
    run(store.supersede("acme", a.id, b.id, "merge"))
    run(store.forget("acme", a.id, "cleanup"))
    before = run(store.events("acme", limit=1000))
    assert [e.action for e in before] == [
        "added",
        "added",
        "reinforced",
        "superseded",
        "supersedes",
        "forgotten",
    ]
    with pytest.raises(Exception, match="cannot go from"):
        run(store.forget("acme", a.id, "again"))
    with pytest.raises(Exception, match="cannot go from"):
        run(store.supersede("acme", a.id, NewMemory("Gamma"), "late"))
    after = run(store.events("acme", limit=1000))
    assert after == before
    # The failed supersede rolled back its replacement too.
    assert run(store.stats("acme"))["total"] == 2
