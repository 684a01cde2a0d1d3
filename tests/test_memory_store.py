"""The store's operations on a real SQLite file with the real embedding model."""

from __future__ import annotations

import time

import pytest

from memory_core import (
    InvalidInput,
    InvalidTransition,
    ListQuery,
    NewMemory,
    NotFound,
    RecallQuery,
)
from memory_core.errors import SchemaMismatch


def test_add_get_and_fields(store, run):
    memory = run(
        store.add(
            "acme",
            "default",
            NewMemory(
                "  The user's   email is ada@example.com ",
                kind="fact",
                subject="User",
                attribute="Email",
                value="ada@example.com",
                confidence=0.9,
                provenance={"request_id": "r1", "model": "m"},
                entities=["Ada", "Ada", " "],
            ),
        )
    )
    got = run(store.get("acme", memory.id))
    assert got == memory
    assert got.content == "The user's email is ada@example.com"
    assert (got.subject, got.attribute, got.value) == ("user", "email", "ada@example.com")
    assert got.status == "active" and got.severity == "context"
    assert got.provenance == [{"request_id": "r1", "model": "m"}]
    assert got.entities == ["Ada"]
    assert got.content_hash and len(got.content_hash) == 64
    assert run(store.get("acme", "mem_missing")) is None


def test_add_many_and_list_filters_and_paging(store, run):
    items = [NewMemory(f"Fact number {i}", kind="fact" if i % 2 else "goal") for i in range(25)]
    run(store.add_many("acme", "s1", items))
    run(store.add("acme", "s2", NewMemory("In another space", kind="note")))
    page = run(store.list(ListQuery("acme", limit=10)))
    assert len(page.items) == 10 and page.next_cursor
    seen = [m.id for m in page.items]
    while page.next_cursor:
        page = run(store.list(ListQuery("acme", limit=10, cursor=page.next_cursor)))
        seen += [m.id for m in page.items]
    assert len(seen) == len(set(seen)) == 26
    goals = run(store.list(ListQuery("acme", kinds=["goal"], limit=100))).items
    assert len(goals) == 13 and all(m.kind == "goal" for m in goals)
    s2 = run(store.list(ListQuery("acme", spaces=["s2"]))).items
    assert [m.content for m in s2] == ["In another space"]
    future = run(store.list(ListQuery("acme", created_after=time.time() + 60))).items
    assert future == []
    with pytest.raises(InvalidInput):
        run(store.list(ListQuery("acme", statuses=["deleted"])))
    with pytest.raises(InvalidInput):
        run(store.list(ListQuery("acme", cursor="abc")))


def test_supersede_links_and_history(store, run):
    old = run(
        store.add(
            "acme",
            "default",
            NewMemory(
                "The user prefers a formal tone in emails",
                kind="preference",
                subject="user",
                attribute="email_tone",
                value="formal",
            ),
        )
    )
    superseded, new = run(
        store.supersede(
            "acme",
            old.id,
            NewMemory(
                "The user prefers casual emails",
                kind="preference",
                subject="user",
                attribute="email_tone",
                value="casual",
            ),
            "user corrected it",
            actor="extraction",
        )
    )
    assert superseded.status == "superseded" and superseded.superseded_by == new.id
    assert superseded.status_reason == "user corrected it"
    assert superseded.content == "The user prefers a formal tone in emails"  # kept for audit
    history = run(store.history("acme", old.id))
    assert [e.action for e in history] == ["added", "superseded"]
    assert history[-1].detail == {"superseded_by": new.id} and history[-1].actor == "extraction"
    assert [e.action for e in run(store.history("acme", new.id))] == ["added", "supersedes"]
    recalled = run(store.recall(RecallQuery("acme", ["default"], "email tone")))
    assert [r.memory.id for r in recalled] == [new.id]
    with pytest.raises(InvalidTransition):
        run(store.supersede("acme", old.id, new.id, "again"))
    assert [e.action for e in run(store.history("acme", old.id))] == ["added", "superseded"]


def test_supersede_by_existing_memory(store, run):
    a = run(store.add("acme", "default", NewMemory("Lives in Paris")))
    b = run(store.add("acme", "default", NewMemory("Lives in Lyon")))
    old, new = run(store.supersede("acme", a.id, b.id, "moved"))
    assert old.superseded_by == b.id and new.id == b.id
    with pytest.raises(InvalidInput):
        run(store.supersede("acme", b.id, b.id, "self"))


def test_reinforce_raises_confidence_without_new_row(store, run):
    memory = run(store.add("acme", "default", NewMemory("Likes tea", confidence=0.5)))
    again = run(store.reinforce("acme", memory.id, {"request_id": "r2"}))
    assert again.confidence == pytest.approx(0.6)
    assert again.provenance == [{"request_id": "r2"}]
    assert run(store.stats("acme"))["total"] == 1
    assert [e.action for e in run(store.history("acme", memory.id))] == ["added", "reinforced"]


def test_forget_and_illegal_moves(store, run):
    memory = run(store.add("acme", "default", NewMemory("Secret plan")))
    forgotten = run(store.forget("acme", memory.id, "user asked", actor="admin"))
    assert forgotten.status == "forgotten" and forgotten.content is None
    assert forgotten.content_hash is None and forgotten.status_reason == "user asked"
    with pytest.raises(InvalidTransition):
        run(store.forget("acme", memory.id, "twice"))
    with pytest.raises(InvalidInput):
        run(store.reinforce("acme", memory.id))
    with pytest.raises(NotFound):
        run(store.forget("acme", "mem_nope", "x"))
    assert [e.action for e in run(store.history("acme", memory.id))] == ["added", "forgotten"]


def test_expiry(store, run):
    soon = run(
        store.add("acme", "default", NewMemory("Temporary code 4711", expires_at=time.time() + 0.2))
    )
    keep = run(store.add("acme", "default", NewMemory("Permanent code 4711")))
    time.sleep(0.3)
    # Past its time it is not recalled even before expire_due runs.
    assert [
        r.memory.id for r in run(store.recall(RecallQuery("acme", ["default"], "code 4711")))
    ] == [keep.id]
    assert run(store.expire_due()) == 1
    assert run(store.get("acme", soon.id)).status == "expired"
    assert run(store.expire_due()) == 0
    assert run(store.forget("acme", soon.id, "cleanup")).status == "forgotten"


def test_events_feed_with_cursor(store, run):
    a = run(store.add("acme", "default", NewMemory("One")))
    run(store.add("other", "default", NewMemory("Elsewhere")))
    run(store.reinforce("acme", a.id))
    run(store.forget("acme", a.id, "done"))
    first = run(store.events("acme", since=0, limit=2))
    assert [e.action for e in first] == ["added", "reinforced"]
    rest = run(store.events("acme", since=first[-1].seq))
    assert [e.action for e in rest] == ["forgotten"]
    assert all(e.tenant == "acme" for e in first + rest)
    assert [e.seq for e in first + rest] == sorted(e.seq for e in first + rest)
    assert run(store.events("acme", since=rest[-1].seq)) == []


def test_stats(store, run):
    a = run(store.add("acme", "s1", NewMemory("A", kind="constraint")))
    run(store.add("acme", "s2", NewMemory("B")))
    run(store.forget("acme", a.id, "x"))
    stats = run(store.stats("acme"))
    assert stats["total"] == 2
    assert stats["by_status"] == {"active": 1, "forgotten": 1}
    assert stats["by_space"] == {"s1": 1, "s2": 1}


def test_export_import_round_trip_is_idempotent(store, run, other_store):
    a = run(store.add("acme", "default", NewMemory("Prefers formal emails", kind="preference")))
    run(store.supersede("acme", a.id, NewMemory("Prefers casual emails", kind="preference"), "fix"))
    b = run(store.add("acme", "work", NewMemory("Never deploy on Fridays", kind="constraint")))
    c = run(store.add("acme", "work", NewMemory("Shared a password once")))
    run(store.forget("acme", c.id, "privacy"))

    async def export() -> list[str]:
        return [line async for line in store.export("acme")]

    lines = run(export())
    assert len(lines) == 4
    other = other_store(same=False)
    result = run(other.import_lines("acme", lines))
    assert (result.imported, result.skipped, result.errors) == (4, 0, [])
    again = run(other.import_lines("acme", lines))
    assert (again.imported, again.skipped) == (0, 4)
    assert run(other.stats("acme"))["by_status"] == run(store.stats("acme"))["by_status"]
    original = [e.action for e in run(store.history("acme", a.id))]
    copied = [e.action for e in run(other.history("acme", a.id))]
    assert copied == [*original, "imported"]
    hits = run(other.recall(RecallQuery("acme", ["work"], "deploy on Friday")))
    assert [h.memory.id for h in hits] == [b.id]
    assert run(other.get("acme", c.id)).content is None
    bad = run(other.import_lines("acme", ["{oops", '{"format": "x"}', ""]))
    assert len(bad.errors) == 2 and bad.imported == 0
    taken = run(other.import_lines("intruder", lines[:1]))
    assert taken.imported == 0 and "another tenant" in taken.errors[0]


def test_schema_is_versioned_and_bound_to_embedder(store, other_store):
    class OtherEmbedder:
        name = "other-model"
        dim = 8

    assert store.schema_version >= 1
    with pytest.raises(SchemaMismatch, match="all-MiniLM"):
        other_store(same=True, model=OtherEmbedder())


def test_bad_ids_are_rejected(store, run):
    with pytest.raises(InvalidInput, match="tenant id"):
        run(store.add("bad tenant", "default", NewMemory("x")))
    with pytest.raises(InvalidInput, match="space id"):
        run(store.recall(RecallQuery("acme", ["ok", "no/slash"], "x")))


@pytest.mark.parametrize(
    "query",
    [
        "",
        "   ",
        "\x00\x01\u200b",
        "🙂" * 50,
        "x" * 100_000,
        '"unbalanced AND ( NEAR',
        "NOT OR AND",
        "日本語のクエリ",
    ],
)
def test_odd_queries_do_not_fail(store, run, query):
    run(store.add("acme", "default", NewMemory("Something to find")))
    results = run(store.recall(RecallQuery("acme", ["default"], query)))
    assert isinstance(results, list)


def test_recall_breakdown_explains_score(store, run):
    run(
        store.add_many(
            "acme",
            "default",
            [
                NewMemory("Never push to main without review", kind="constraint"),
                NewMemory("The build failed because of a missing lockfile", kind="error"),
                NewMemory("The user has a dog named Rex"),
            ],
        )
    )
    results = run(store.recall(RecallQuery("acme", ["default"], "push to main review", top_k=3)))
    top = results[0]
    assert top.memory.content == "Never push to main without review"
    assert {"vector_rank", "vector_similarity", "text_rank", "fused", "score"} <= set(top.breakdown)
    assert top.breakdown["severity_factor"] > 1
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)


def test_writes_through_another_store_are_recalled(store, run, other_store):
    """A second store on the same database (the CLI, or another replica) changes what
    recall sees: the SQLite vector cache follows the event feed; Postgres shares its rows."""
    first = run(store.add("acme", "default", NewMemory("The user's cat is called Miso")))
    assert [
        r.memory.id for r in run(store.recall(RecallQuery("acme", ["default"], "cat name")))
    ] == [first.id]
    other = other_store(same=True)
    second = run(other.add("acme", "default", NewMemory("The user's dog is called Pepper")))
    run(other.forget("acme", first.id, "asked"))
    results = run(store.recall(RecallQuery("acme", ["default"], "pet names", use_text=False)))
    assert [r.memory.id for r in results] == [second.id]


def test_common_words_are_left_to_the_vectors_rare_ones_still_rank(store, run):
    """Past the postings budget a word is not ranked by full text (SQLite: the word's
    memory count in the read spaces; Postgres: the planner's lexeme statistics); rarer
    words still are."""
    import numpy as np

    from memory_core.recall import POSTINGS_BUDGET

    count = POSTINGS_BUDGET + 100
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((count, store.embedder.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    items = [NewMemory(f"Coffee note number {i}") for i in range(count)]
    run(store.add_embedded("acme", "default", items, vectors))
    rare = run(store.add("acme", "default", NewMemory("Coffee beans come from Zanzibar")))
    if store.backend == "postgres":
        import psycopg

        with psycopg.connect(store.location, autocommit=True) as conn:
            conn.execute("ANALYZE memories")
        assert "coffe" in run(store._common_lexemes())
    query = RecallQuery("acme", ["default"], "coffee zanzibar", use_vector=False, top_k=5)
    results = run(store.recall(query))
    assert [r.memory.id for r in results] == [rare.id]  # "coffee" alone ranks nothing
