"""Standing rules' own recall path (memory_core/standing_rules.py), on every backend with
the real embedding model: it finds the rule the hybrid recall buries under facts that
share the request's words, takes at most its reserved places, embeds nothing, and
returns nothing the SQL guard would refuse."""

from __future__ import annotations

import time
from typing import Any

import openai

from memory_core import NewMemory, RecallQuery
from memory_core.sqlite.standing import guarded
from memory_core.standing_rules import (
    STANDING_KINDS,
    StandingPolicy,
    cached_query_vector,
    candidates,
    with_standing_rules,
)

REQUEST = "Suggest a dinner I can cook in thirty minutes."
RULE = "All recipes must be vegetarian, no meat or fish."
OTHER_RULES = [
    ("preference", "I prefer window seats on flights."),
    ("constraint", "Never promise delivery dates to customers."),
    ("constraint", "Use metric units, never pounds or inches."),
    ("error", "You once forgot the legal sign-off on a press release; ask for it."),
]
FACTS = [  # share the request's words: the hybrid ranks them first
    "We had dinner at Luigi's on Friday.",
    "Tom can cook a mean risotto in thirty minutes.",
    "The meeting lasted thirty minutes.",
    "Suggest the quarterly dinner venue to Ana by Monday.",
    "I cook dinner for the kids on weekdays.",
]
POLICY = StandingPolicy(slots=2, min_similarity=0.2, few=3, margin=0.1)


def seed(run: Any, store: Any, tenant: str = "acme", space: str = "default") -> dict[str, Any]:
    rules = [NewMemory(RULE, kind="constraint")]
    rules += [NewMemory(text, kind=kind) for kind, text in OTHER_RULES]
    added = run(store.add_many(tenant, space, [*rules, *(NewMemory(f) for f in FACTS)]))
    return {"rule": added[0], "others": added[1 : len(rules)], "facts": added[len(rules) :]}


def test_the_path_finds_the_rule_the_hybrid_misses(store, run):
    seeded = seed(run, store)
    query = RecallQuery("acme", ["default"], REQUEST, top_k=3)
    plain = run(store.recall(query))
    assert seeded["rule"].id not in [r.memory.id for r in plain]  # the problem
    merged = run(with_standing_rules(store, query, plain, POLICY))
    ids = [r.memory.id for r in merged]
    assert seeded["rule"].id in ids
    assert len(merged) == 3
    assert ids[0] == plain[0].memory.id  # the best fact keeps its place
    added = [r for r in merged if r.breakdown.get("standing_slot")]
    assert [r.memory.id for r in added] == [seeded["rule"].id]  # the others are too far
    assert added[0].breakdown["standing_similarity"] >= POLICY.min_similarity
    # A recall narrowed to some kinds or a subject gets nothing else.
    narrowed = replace_kinds(query, ["fact", "note"])
    assert run(with_standing_rules(store, narrowed, plain, POLICY)) == plain
    # Off: the hybrid's results as they were.
    off = run(with_standing_rules(store, query, plain, StandingPolicy(slots=0)))
    assert [r.memory.id for r in off] == [r.memory.id for r in plain]


def test_reserved_places_never_exceed_the_setting(store, run):
    many = [
        NewMemory(f"When cooking dinner, rule {i}: use {x}.", kind="constraint")
        for i, x in enumerate(
            ["no salt", "olive oil", "fresh herbs", "one pan", "no sugar", "lentils"]
        )
    ]
    run(store.add_many("acme", "default", [*many, *(NewMemory(f) for f in FACTS)]))
    query = RecallQuery("acme", ["default"], REQUEST, top_k=4, kinds=None)
    plain = run(store.recall(replace_kinds(query, ["fact"])))  # facts only: all 4 places
    assert len(plain) == 4
    for slots in (0, 1, 2, 3):
        policy = StandingPolicy(slots=slots, min_similarity=-1.0, few=0, margin=1.0)
        merged = run(with_standing_rules(store, query, plain, policy))
        added = [r for r in merged if r.breakdown.get("standing_slot")]
        assert len(added) == slots
        assert len(merged) == 4
        assert all(r.memory.kind in STANDING_KINDS for r in added)
        # Only the last `slots` places are taken: the first ones stay, in order.
        assert [r.memory.id for r in merged[: 4 - slots]] == [
            r.memory.id for r in plain[: 4 - slots]
        ]
    # A fact clearly closer to the request than every rule is never pushed out.
    strict = StandingPolicy(slots=3, min_similarity=-1.0, few=0, margin=-1.0)
    merged = run(with_standing_rules(store, query, plain, strict))
    assert [r.memory.id for r in merged] == [r.memory.id for r in plain]


def replace_kinds(query: RecallQuery, kinds: list[str]) -> RecallQuery:
    from dataclasses import replace

    return replace(query, kinds=kinds)


def test_a_few_rules_come_whatever_their_similarity(store, run):
    rule = run(store.add("acme", "default", NewMemory(OTHER_RULES[0][1], kind="preference")))
    run(store.add_many("acme", "default", [NewMemory(f) for f in FACTS]))
    query = RecallQuery("acme", ["default"], REQUEST, top_k=3)
    plain = run(store.recall(query))
    assert rule.id not in [r.memory.id for r in plain]
    policy = StandingPolicy(slots=2, min_similarity=0.9, few=1, margin=1.0)
    assert rule.id in [r.memory.id for r in run(with_standing_rules(store, query, plain, policy))]
    alone = StandingPolicy(slots=2, min_similarity=0.9, few=0, margin=1.0)
    assert rule.id not in [
        r.memory.id for r in run(with_standing_rules(store, query, plain, alone))
    ]


def test_nothing_is_embedded_for_the_path(store, run):
    seed(run, store)
    query = RecallQuery("acme", ["default"], REQUEST, top_k=3)
    plain = run(store.recall(query))
    batches = len(store.batcher.batches)
    run(with_standing_rules(store, query, plain, POLICY))
    assert len(store.batcher.batches) == batches  # the cached vector was reused
    # Text-only recall computed no vector: the path leaves the results as they are.
    text_only = RecallQuery("acme", ["default"], "a dinner for tonight, quickly", top_k=3)
    text_only.use_vector = False
    results = run(store.recall(text_only))
    assert cached_query_vector(store, text_only) is None
    assert run(with_standing_rules(store, text_only, results, POLICY)) == results
    assert len(store.batcher.batches) == batches


def test_rules_out_of_scope_never_come_back(store, run):
    """Forgotten, superseded, expired, another tenant's, an unreadable space's, a plain
    fact: the lookup returns only the tenant's active standing rules in the read spaces."""
    rule = NewMemory(RULE, kind="constraint")
    kept = run(store.add("acme", "default", rule))
    forgotten = run(store.add("acme", "default", NewMemory(RULE + " Really.", kind="constraint")))
    run(store.forget("acme", forgotten.id, "test"))
    old = run(store.add("acme", "default", NewMemory("Recipes: vegetarian only.", kind="error")))
    run(store.supersede("acme", old.id, NewMemory("Recipes: vegan only.", kind="fact"), "t"))
    soon = NewMemory("Recipes must have no meat.", kind="preference", expires_at=time.time() + 1)
    expired = run(store.add("acme", "default", soon))
    other_tenant = run(store.add("rival", "default", NewMemory(RULE, kind="constraint")))
    hidden = run(store.add("acme", "private", NewMemory(RULE + " (private)", kind="constraint")))
    fact = run(store.add("acme", "default", NewMemory("Dinner recipes must be vegetarian.")))
    time.sleep(1.1)  # `expired` is past its time but not yet swept: only the guard stops it
    query = RecallQuery("acme", ["default"], REQUEST, top_k=5)
    run(store.recall(query))  # caches the vector, as recall does before the path
    vector = cached_query_vector(store, query)
    found = run(candidates(store, query, vector, 20))
    assert [m.id for m, _ in found.rules] == [kept.id]
    # The guard alone (SQLite), handed every one of them as candidates: only `kept` passes.
    if store.backend != "postgres":
        every = [kept, forgotten, old, expired, other_tenant, hidden, fact]

        def guard(conn: Any) -> list[str]:
            rowids = {
                m.id: conn.execute("SELECT rowid FROM memories WHERE id = ?", (m.id,)).fetchone()[0]
                for m in every
            }
            hits = [(rowids[m.id], 0.5) for m in every]
            return [m.id for m, _ in guarded(conn, query, hits, time.time())]

        assert run(store.run_read(guard)) == [kept.id]


def test_the_proxy_injects_the_rule(fake, memory_proxy):
    """The recall interceptor calls the path: the rule reaches the system prompt the
    upstream receives; with `recall_rule_slots=0` it does not."""
    for slots, expected in ((2, True), (0, False)):
        server, seeded = memory_proxy(recall_top_k=3, recall_rule_slots=slots)
        seeded.add("acme", "default", RULE, kind="constraint")
        for kind, text in OTHER_RULES:
            seeded.add("acme", "default", text, kind=kind)
        for text in FACTS:
            seeded.add("acme", "default", text)
        client = openai.OpenAI(
            base_url=server.url + "/v1",
            api_key="sk-test",
            max_retries=0,
            default_headers={"X-Memrelay-Tenant": "acme"},
        )
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": REQUEST}])
        system = fake.chat_requests()[-1].json()["messages"][0]["content"]
        assert (RULE in system) is expected, system
        assert ("Rules remembered" in system) is expected  # the constraint block


def test_the_best_places_are_never_taken(tmp_path, embedder):
    """A rule takes only one of the last `slots` places: here those hold facts clearly
    closer to the request, so the text-only best hit above them stays too."""
    import asyncio

    from memory_core import SQLiteStore
    from memory_core.recall import Recalled
    from memory_core.standing_rules import Candidates, merge

    async def scenario() -> None:
        store = await SQLiteStore.open(tmp_path / "m.db", embedder)
        try:
            facts = await store.add_many("acme", "default", [NewMemory(f) for f in FACTS[:3]])
            rule = await store.add("acme", "default", NewMemory(RULE, kind="constraint"))
        finally:
            await store.close()
        results = [
            Recalled(facts[0], 0.9, {"text_rank": 1}),  # found by its words alone
            Recalled(facts[1], 0.8, {"vector_similarity": 0.9}),
            Recalled(facts[2], 0.7, {"vector_similarity": 0.9}),
        ]
        found = Candidates([(rule, 0.5)], in_scope=10)
        policy = StandingPolicy(slots=1, min_similarity=0.2, few=0, margin=0.3)
        assert merge(results, found, 3, policy) == results
        closer = Candidates([(rule, 0.65)], in_scope=10)  # now within the margin
        assert [r.memory.id for r in merge(results, closer, 3, policy)] == [
            facts[0].id,
            facts[1].id,
            rule.id,
        ]

    asyncio.run(scenario())


def test_postgres_finds_standing_rules_by_index(pg_server, embedder):
    """The Postgres lookup reads the tenant's standing rules through their own index
    (schema step 4), not every memory of the tenant."""
    import asyncio

    from memory_core.postgres.store import PostgresStore

    async def scenario() -> None:
        store = await PostgresStore.open(pg_server.new_database(), embedder)
        try:
            assert store.schema_version >= 4
            rows = await store.fetch(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'memories_standing'"
            )
            assert rows and "(tenant, kind)" in rows[0][0] and "active" in rows[0][0]
        finally:
            await store.close()

    asyncio.run(scenario())


def test_a_failed_lookup_leaves_the_hybrid_results(tmp_path, embedder, caplog):
    """The store closes between the hybrid recall and the lookup: the lookup fails
    (logged) and the recall's own results still come back."""
    import asyncio

    from memory_core import SQLiteStore

    async def scenario() -> None:
        store = await SQLiteStore.open(tmp_path / "m.db", embedder)
        await store.add_many("acme", "default", [NewMemory(f) for f in FACTS])
        await store.add("acme", "default", NewMemory(RULE, kind="constraint"))
        query = RecallQuery("acme", ["default"], REQUEST, top_k=3)
        plain = await store.recall(query)
        await store.close()
        assert await with_standing_rules(store, query, plain, POLICY) == plain

    asyncio.run(scenario())
    assert "standing-rule lookup failed" in caplog.text


def test_recall_with_a_policy_equals_the_two_steps(store, run):
    """`RecallQuery.standing` makes the store merge rules itself (on SQLite in the same
    scan and reader job as the hybrid's vector side): the same list, ids, order and
    breakdown, as the hybrid recall followed by `with_standing_rules`; and without a
    policy, the hybrid's results alone."""
    from dataclasses import replace

    seeded = seed(run, store)
    for slots, top_k in ((2, 3), (1, 2), (3, 8)):
        policy = StandingPolicy(slots=slots, min_similarity=0.2, few=3, margin=0.1)
        query = RecallQuery("acme", ["default"], REQUEST, top_k=top_k)
        plain = run(store.recall(query))
        two_steps = run(with_standing_rules(store, query, plain, policy))
        one_step = run(store.recall(replace(query, standing=policy)))
        assert [(r.memory.id, r.breakdown) for r in one_step] == [
            (r.memory.id, r.breakdown) for r in two_steps
        ]
    assert seeded["rule"].id in [
        r.memory.id
        for r in run(store.recall(RecallQuery("acme", ["default"], REQUEST, 3, standing=POLICY)))
    ]
    assert seeded["rule"].id not in [
        r.memory.id for r in run(store.recall(RecallQuery("acme", ["default"], REQUEST, 3)))
    ]
    # The guard holds on this path too: the rule forgotten, it never comes back.
    run(store.forget("acme", seeded["rule"].id, "test"))
    again = run(store.recall(RecallQuery("acme", ["default"], REQUEST, 3, standing=POLICY)))
    assert seeded["rule"].id not in [r.memory.id for r in again]
    # Another tenant's recall with a policy sees none of acme's rules.
    other = run(store.recall(RecallQuery("other", ["default"], REQUEST, 8, standing=POLICY)))
    assert other == []
