"""Recall's search in a child process (memory_core/sqlite/search_process.py), with real
parts: real SQLite files, the real embedding model, real child processes.

The store with the child must answer exactly as a plain store on the same file does,
see every write at once (its own and another writer's), keep tenants apart, survive the
child's death (in-process meanwhile, then a new child), never hand one caller another
caller's answer when callers give up mid-exchange, and leave no child behind.

One child per store costs about a second to start, so the checks that leave the child
as they found it share one module-wide pair of stores on one file: `remote` (search
process) and `plain` (in-process, and the "other writer"). Each check uses tenants of
its own. How many searches the child answered is counted by wrapping the store's own
`SearchProcess` methods on the instance (the real calls, counted).

A child that hangs (alive, answering nothing) misses its heartbeat: it is killed and
replaced, and the recalls waiting on it search in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from memory_core import NewMemory, RecallQuery, SQLiteStore
from memory_core.recall import Recalled, clean_query, query_terms
from memory_core.sqlite.search_process import CHANNELS, SearchProcessDown
from memory_core.sqlite.tenant_bm25 import TermHits
from memory_core.standing_rules import StandingPolicy

ROOT = Path(__file__).resolve().parents[1]

# Tenant "acme": three spaces, every kind, subjects; "globex" shares some texts.
ACME: dict[str, list[NewMemory]] = {
    "work": [
        NewMemory("The team writes its backend services in Go.", subject="team"),
        NewMemory("Deploys to production happen on Tuesdays after the standup.", kind="fact"),
        NewMemory("The staging database is PostgreSQL 16 on a single VM.", subject="infra"),
        NewMemory("Never deploy on a Friday afternoon.", kind="constraint", subject="infra"),
        NewMemory("Ship the billing migration before the end of the quarter.", kind="goal"),
        NewMemory("The user prefers short code reviews with bullet points.", kind="preference"),
        NewMemory("You once merged without running the tests; always run them.", kind="error"),
        NewMemory("The on-call rotation changes every Monday at nine.", subject="team"),
        NewMemory("Grafana dashboards live in the observability repository.", kind="note"),
        NewMemory("The user's manager is called Priya.", subject="user"),
    ],
    "home": [
        NewMemory("The user lives in Lyon with two cats.", subject="user"),
        NewMemory("The user is allergic to peanuts.", kind="constraint", subject="user"),
        NewMemory("The user prefers vegetarian recipes.", kind="preference", subject="user"),
        NewMemory("The user's sister Ana visits every December.", subject="family"),
        NewMemory("Plan a cycling trip through the Alps next summer.", kind="goal"),
        NewMemory("The boiler was serviced in March.", kind="note"),
        NewMemory("The user runs five kilometres on Sunday mornings.", subject="user"),
    ],
    "shared": [
        NewMemory("The user's favourite programming language is Go.", subject="user"),
        NewMemory("Use metric units, never pounds or inches.", kind="constraint"),
        NewMemory("The user reads science fiction before sleeping.", subject="user"),
        NewMemory("Answer in British English spelling.", kind="preference"),
    ],
}
GLOBEX: dict[str, list[NewMemory]] = {
    "work": [
        NewMemory("The team writes its backend services in Go.", subject="team"),
        NewMemory("The user lives in Lyon with two cats.", subject="user"),
        NewMemory("Globex builds its front end in TypeScript.", subject="team"),
        NewMemory("Never share customer names in replies.", kind="constraint"),
    ],
}
RULES = StandingPolicy(slots=2, min_similarity=-1.0, few=0, margin=1.0)  # rules get in


@dataclass
class Counted:
    """Searches the child answered (`ok`), ones it could not (`down`), ones whose caller
    gave up inside the call (`cancelled`: waiting for a channel or for the answer),
    exchanges begun with the child (`exchanges`), and forget's syncs."""

    ok: int = 0
    down: int = 0
    cancelled: int = 0
    exchanges: int = 0
    syncs: int = 0


def count_searches(store: SQLiteStore) -> Counted:
    """Wrap the store's own SearchProcess.search, .sync and ._exchange on the instance
    (the real calls still run) to see which recalls the child answered."""
    process = store._search
    assert process is not None
    counted = Counted()
    search, sync, exchange = process.search, process.sync, process._exchange

    async def counting_search(request: Any) -> list[Recalled]:
        try:
            result = await search(request)
        except SearchProcessDown:
            counted.down += 1
            raise
        except asyncio.CancelledError:
            counted.cancelled += 1
            raise
        counted.ok += 1
        return result

    async def counting_sync(tenant: str) -> None:
        await sync(tenant)
        counted.syncs += 1

    async def counting_exchange(*args: Any) -> Any:
        counted.exchanges += 1
        return await exchange(*args)

    process.search = counting_search  # type: ignore[method-assign]
    process._exchange = counting_exchange  # type: ignore[method-assign]
    process.sync = counting_sync  # type: ignore[method-assign]
    return counted


@dataclass
class World:
    loop: asyncio.AbstractEventLoop
    db: Path
    plain: SQLiteStore
    remote: SQLiteStore
    counted: Counted

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)


@pytest.fixture(scope="module")
def world(tmp_path_factory: Any, embedder: Any) -> Iterator[World]:
    loop = asyncio.new_event_loop()
    db = tmp_path_factory.mktemp("search-process") / "memory.db"
    plain = loop.run_until_complete(SQLiteStore.open(db, embedder))
    for tenant, spaces in (("acme", ACME), ("globex", GLOBEX)):
        for space, items in spaces.items():
            loop.run_until_complete(plain.add_many(tenant, space, items))
    remote = loop.run_until_complete(SQLiteStore.open(db, embedder, search_process=True))
    counted = count_searches(remote)
    yield World(loop, db, plain, remote, counted)
    loop.run_until_complete(remote.close())
    loop.run_until_complete(plain.close())
    loop.close()


# The two recalls run a moment apart, so recency (and the score) moves by ~1e-10; a
# breakdown rounded to 6 places may then differ by one unit in its last place.
TOLERANCE = 1e-6 + 1e-9


def same_value(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        return abs(got - want) <= TOLERANCE
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in want)
    if isinstance(want, list | tuple) and isinstance(got, list | tuple):
        return len(got) == len(want) and all(map(same_value, got, want))
    return bool(got == want)


def assert_same(got: list[Recalled], want: list[Recalled], label: Any = "") -> None:
    """Same memories in the same order, scores to 1e-6, same breakdowns."""
    assert [r.memory.id for r in got] == [r.memory.id for r in want], label
    for g, w in zip(got, want, strict=True):
        assert g.memory == w.memory, label
        assert abs(g.score - w.score) <= TOLERANCE, (label, g.score, w.score)
        assert same_value(g.breakdown, w.breakdown), (label, g.breakdown, w.breakdown)


def pid_gone(pid: int) -> bool:
    """No such process, or a zombie (exited, not yet reaped by whoever adopted it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_until(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


# -- 1. same answer ------------------------------------------------------------------

NO_TERMS = "and then what was that"
SAME_ANSWER_QUERIES = [
    RecallQuery("acme", ["work"], "Which language are our backend services written in?"),
    RecallQuery("acme", ["work", "home", "shared"], "Where does the user live?", top_k=5),
    RecallQuery("acme", ["home", "shared"], "What should I cook for dinner tonight?", top_k=3),
    RecallQuery("acme", ["work", "shared"], "When can we deploy to production?", top_k=4),
    RecallQuery(
        "acme",
        ["work", "home", "shared"],
        "Tell me about the user",
        kinds=["preference", "constraint"],
    ),
    RecallQuery("acme", ["work", "home", "shared"], "What do you know about me?", subject="user"),
    RecallQuery("acme", ["work", "home"], "Suggest a weekend plan for me", top_k=4, standing=RULES),
    RecallQuery(
        "acme", ["work", "home", "shared"], "How should I write this reply?", standing=RULES
    ),
    RecallQuery("acme", ["work"], "review the deploy", top_k=3, standing=StandingPolicy()),
    RecallQuery("acme", ["work", "home"], "Go backend team Lyon", use_vector=False),
    RecallQuery("acme", ["work", "home", "shared"], "cats", use_vector=False, top_k=2),
    RecallQuery("acme", ["work", "home", "shared"], "Which city is home?", use_text=False),
    RecallQuery("acme", ["work", "home", "shared"], NO_TERMS, top_k=6),
    RecallQuery("acme", ["home"], NO_TERMS, top_k=6, standing=RULES),
    RecallQuery("globex", ["work"], "Which language are our backend services written in?"),
    RecallQuery("globex", ["work"], "How should I reply about customers?", standing=RULES),
    RecallQuery("globex", ["home"], "Where does the user live?"),  # a space it never wrote
    RecallQuery("initech", ["work"], "Which language are our backend services written in?"),
]


def test_the_child_answers_exactly_as_in_process(world: World) -> None:
    assert query_terms(clean_query(NO_TERMS)) == []  # the no-terms queries have none
    status = world.remote.search_status()
    assert status is not None and status["up"] and status["pid"] != os.getpid()
    assert world.plain.search_status() is None
    before = world.counted.ok
    answers = []
    for query in SAME_ANSWER_QUERIES:
        want = world.run(world.plain.recall(query))
        got = world.run(world.remote.recall(query))
        assert_same(got, want, query)
        answers.append(got)
    # Every recall was answered by the child, none fell back.
    assert world.counted.ok - before == len(SAME_ANSWER_QUERIES)
    assert world.counted.down == 0
    # The comparison has teeth: the filters, the standing rules and both sides mattered.
    assert all(answers[:-2]) and answers[-2:] == [[], []]  # nothing for a scope never written
    assert {r.memory.kind for r in answers[4]} <= {"preference", "constraint"}
    assert {r.memory.subject for r in answers[5]} == {"user"}
    assert any(r.breakdown.get("standing_slot") for r in answers[6])
    assert {r.memory.space for r in answers[2]} <= {"home", "shared"}
    assert {r.memory.tenant for r in answers[14]} == {"globex"}


# -- 2. read your writes -------------------------------------------------------------


def test_writes_are_seen_at_once_through_the_child(world: World) -> None:
    remote, plain, counted, run = world.remote, world.plain, world.counted, world.run
    tenant = "rw"
    coffee = run(remote.add(tenant, "main", NewMemory("The coffee machine is on floor two.")))

    def recall(text: str, **options: Any) -> list[Recalled]:
        """The child's answer (checked to be the child's, and the in-process one)."""
        query = RecallQuery(tenant, ["main"], text, top_k=10, **options)
        before = counted.ok
        got = run(remote.recall(query))
        assert counted.ok == before + 1  # the child answered
        assert_same(got, run(plain.recall(query)), query)
        return got

    def first(text: str) -> str:
        """The best memory by its vector alone (no full-text side to find it instead)."""
        return recall(text, use_text=False)[0].memory.id

    def ids(text: str) -> set[str]:
        """Everything the child returns for `text`, by vector alone, by text alone, both."""
        found: set[str] = set()
        for options in ({"use_text": False}, {"use_vector": False}, {}):
            found |= {r.memory.id for r in recall(text, **options)}
        return found

    assert first("Where is the coffee machine?") == coffee.id  # the child holds the tenant

    # A write through the store itself: found by its vector alone, at once.
    falcon = run(remote.add(tenant, "main", NewMemory("The staging server Falcon runs in Oslo.")))
    assert first("Where does the staging server Falcon run?") == falcon.id
    # Another writer's (a second store object on the file, as the CLI would be).
    heron = run(plain.add(tenant, "main", NewMemory("Heron is the name of the build robot.")))
    assert first("What is the name of the build robot?") == heron.id

    # Superseded, through either: the replacement found, the old one never again.
    moved = NewMemory("The staging server Falcon moved to Bergen.")
    _, falcon2 = run(remote.supersede(tenant, falcon.id, moved, "moved"))
    assert first("Where does the staging server Falcon run?") == falcon2.id
    assert falcon.id not in ids("The staging server Falcon runs in Oslo.")
    renamed = NewMemory("Kestrel is the name of the build robot.")
    _, heron2 = run(plain.supersede(tenant, heron.id, renamed, "renamed"))
    assert first("What is the name of the build robot?") == heron2.id
    assert heron.id not in ids("Heron is the name of the build robot.")

    # Retired and forgotten, through either: never returned.
    run(plain.retire(tenant, falcon2.id, "decommissioned"))
    assert falcon2.id not in ids("The staging server Falcon moved to Bergen.")
    syncs = counted.syncs
    run(remote.forget(tenant, heron2.id, "asked"))
    assert counted.syncs == syncs + 1  # forget had the child drop the vector at once
    assert heron2.id not in ids("Kestrel is the name of the build robot.")
    parrot = run(remote.add(tenant, "main", NewMemory("The parrot in reception is called Kiwi.")))
    assert first("What is the parrot in reception called?") == parrot.id
    run(plain.forget(tenant, parrot.id, "asked"))
    assert parrot.id not in ids("The parrot in reception is called Kiwi.")
    run(remote.retire(tenant, coffee.id, "moved out"))
    assert ids("Where is the coffee machine?") == set()  # nothing active is left


def test_common_terms_kept_by_the_child_follow_writes(world: World) -> None:
    """A term in at least TermHits.MIN_MATCHES memories has its postings kept (in the
    child too, shared by its threads) until the tenant's next write: a memory added by
    another writer is found by that term alone at once, a forgotten one is gone."""
    remote, plain, counted, run = world.remote, world.plain, world.counted, world.run
    nouns = ["budget", "roadmap", "hiring", "design", "testing", "launch", "pricing"]
    items = [
        NewMemory(f"Project update {i}: the {nouns[i % len(nouns)]} work is on track.")
        for i in range(TermHits.MIN_MATCHES + 20)
    ]
    run(plain.add_many("big", "main", items))
    query = RecallQuery("big", ["main"], "project", use_vector=False, top_k=5)
    both = replace(query, text="project hiring track", use_vector=True)

    def recall(q: RecallQuery) -> list[Recalled]:
        before = counted.ok
        got = run(remote.recall(q))
        assert counted.ok == before + 1
        assert_same(got, run(plain.recall(q)), q)
        return got

    for _ in range(2):  # the second time from the kept postings
        assert len(recall(query)) == 5
        assert recall(both)
    loud = run(plain.add("big", "main", NewMemory("Project, project, project!")))
    assert recall(query)[0].memory.id == loud.id
    run(remote.forget("big", loud.id, "asked"))
    assert loud.id not in {r.memory.id for r in recall(query)}
    assert loud.id not in {r.memory.id for r in recall(both)}


# -- 3. tenants ----------------------------------------------------------------------

TWIN_TEXTS = [
    "The launch code word is Bluebird.",
    "Our biggest customer is Northwind Traders.",
    "The user prefers dark mode in every editor.",
    "Never mention the acquisition talks.",
]


def test_tenants_never_get_each_others_memories(world: World) -> None:
    remote, plain, counted, run = world.remote, world.plain, world.counted, world.run
    # Identical texts, space and kinds (so identical vectors), one tenant through each store.
    twins = [NewMemory(t, kind="constraint" if "Never" in t else "fact") for t in TWIN_TEXTS]
    a_ids = {m.id for m in run(plain.add_many("iso-a", "main", twins))}
    b_ids = {m.id for m in run(remote.add_many("iso-b", "main", twins))}
    secret = run(remote.add("iso-a", "main", NewMemory("The vault combination is 4-8-15-16.")))
    a_ids.add(secret.id)
    texts = [*TWIN_TEXTS, secret.content, "What is the vault combination?", "customer code word"]
    queries = [
        RecallQuery(tenant, ["main"], text, top_k=10, **options)
        for tenant in ("iso-a", "iso-b")
        for text in texts
        for options in ({}, {"use_text": False}, {"use_vector": False}, {"standing": RULES})
    ]
    before = counted.ok

    async def all_at_once() -> list[list[Recalled]]:
        return list(await asyncio.gather(*(remote.recall(q) for q in queries)))

    for answers in ([run(remote.recall(q)) for q in queries], run(all_at_once())):
        for query, got in zip(queries, answers, strict=True):
            found = {r.memory.id for r in got}
            own, other = (a_ids, b_ids) if query.tenant == "iso-a" else (b_ids, a_ids)
            assert found <= own and not found & other, query
            if query.text in TWIN_TEXTS:
                assert found, query  # each tenant gets its own twin
    assert counted.ok - before == 2 * len(queries)
    # B asking for A's secret in A's words gets nothing of A's; a new tenant gets nothing.
    asked = run(remote.recall(RecallQuery("iso-b", ["main"], secret.content, top_k=10)))
    assert secret.id not in {r.memory.id for r in asked}
    assert run(remote.recall(RecallQuery("iso-c", ["main"], secret.content, top_k=10))) == []


# -- 4. the child killed -------------------------------------------------------------


def test_a_killed_child_is_replaced_and_recall_goes_on(world: World, embedder: Any) -> None:
    run = world.run
    store = run(SQLiteStore.open(world.db, embedder, search_process=True))
    try:
        counted = count_searches(store)
        queries = SAME_ANSWER_QUERIES[:8]
        want = [run(world.plain.recall(q)) for q in queries]
        first = store.search_status()
        assert first is not None and first["up"] and first["restarts"] == 0
        os.kill(first["pid"], signal.SIGKILL)
        # Right after: every recall still answers, the same, in-process.
        for query, expected in zip(queries, want, strict=True):
            assert_same(run(store.recall(query)), expected, query)
        assert counted.down >= 1  # the first one found the child gone

        async def together() -> list[list[Recalled]]:
            return list(await asyncio.gather(*(store.recall(q) for q in queries)))

        for got, expected in zip(run(together()), want, strict=True):
            assert_same(got, expected)

        assert wait_until(lambda: _replaced(run, store, first["pid"]), 10), store.search_status()
        second = store.search_status()
        assert second is not None
        assert second["restarts"] == 1 and second["last_exit"] == -signal.SIGKILL
        assert pid_gone(first["pid"])
        # Later recalls go to the new child.
        ok = counted.ok
        for query, expected in zip(queries, want, strict=True):
            assert_same(run(store.recall(query)), expected, query)
        assert counted.ok == ok + len(queries)
        assert store.search_status() == second

        # Killed again with recalls in flight (sent, or waiting for a channel): each
        # of them still gets its own answer, in-process.
        burst = queries * 2
        down = counted.down

        async def killed_during() -> list[list[Recalled]]:
            tasks = [asyncio.ensure_future(store.recall(q)) for q in burst]
            await asyncio.sleep(0.001)  # the first exchanges are under way
            os.kill(second["pid"], signal.SIGKILL)
            return list(await asyncio.wait_for(asyncio.gather(*tasks), 20))

        for query, got in zip(burst, run(killed_during()), strict=True):
            assert_same(got, want[queries.index(query)], query)
        assert counted.down > down
        assert wait_until(lambda: _replaced(run, store, second["pid"]), 10)
        assert store.search_status()["restarts"] == 2  # type: ignore[index]
    finally:
        run(store.close())


def _replaced(run: Callable[[Any], Any], store: SQLiteStore, old_pid: int) -> bool:
    run(asyncio.sleep(0.05))  # the supervisor runs on the store's loop
    status = store.search_status()
    return bool(status and status["up"] and status["pid"] != old_pid)


def test_a_hung_child_does_not_stall_recall(world: World, embedder: Any) -> None:
    run = world.run
    store = run(SQLiteStore.open(world.db, embedder, search_process=True))
    pid = store.search_status()["pid"]  # type: ignore[index]
    query = SAME_ANSWER_QUERIES[0]
    want = run(world.plain.recall(query))
    os.kill(pid, signal.SIGSTOP)  # stuck: alive, its sockets open, answering nothing
    try:
        assert_same(run(asyncio.wait_for(store.recall(query), 3)), want, query)
        # the hung child was killed (a stopped process dies of SIGKILL) and replaced
        assert wait_until(lambda: _replaced(run, store, pid), 15)
        status = store.search_status()
        assert status is not None and status["up"] and status["pid"] != pid, status
        assert status["restarts"] == 1 and status["last_exit"] == -signal.SIGKILL, status
        assert_same(run(store.recall(query)), want, query)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        run(store.close())


def test_ctrl_c_is_for_the_parent_to_act_on(world: World, embedder: Any) -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole foreground process group, child
    included. The server shuts down gracefully and closes its child; the child must not
    die of it first (a KeyboardInterrupt traceback, an error logged, a new child started
    while the server stops)."""
    run = world.run
    store = run(SQLiteStore.open(world.db, embedder, search_process=True))
    try:
        counted = count_searches(store)
        before = store.search_status()
        assert before is not None
        os.kill(before["pid"], signal.SIGINT)
        run(asyncio.sleep(0.5))
        assert not pid_gone(before["pid"])
        assert store.search_status() == before  # same child, no restart
        query = SAME_ANSWER_QUERIES[0]
        assert_same(run(store.recall(query)), run(world.plain.recall(query)), query)
        assert counted.ok == 1
    finally:
        run(store.close())


# -- 5. callers giving up ------------------------------------------------------------


def test_callers_giving_up_never_cross_wire_answers(world: World) -> None:
    remote, counted, run = world.remote, world.counted, world.run
    everything = ["work", "home", "shared"]
    queries = [
        RecallQuery("acme", everything, m.content, top_k=3)
        for items in ACME.values()
        for m in items
    ]
    want = {q.text: run(world.plain.recall(q)) for q in queries}
    # Every query has an answer of its own: a cross-wired one cannot pass for it.
    assert len({tuple(r.memory.id for r in w) for w in want.values()}) == len(queries)
    # Each query once through the child: the same answer, and its vector now cached, so
    # below every recall goes straight to the exchange (no embedding batch to wait for,
    # whose companions would change the query vector slightly).
    took = []
    for query in queries:
        started = time.perf_counter()
        got = run(remote.recall(query))
        took.append(time.perf_counter() - started)
        assert_same(got, want[query.text], query.text)
    pid = remote.search_status()["pid"]  # type: ignore[index]
    # Budgets around one exchange's duration, so that callers leave at every point:
    # waiting for a channel, with the request sent, with the answer on its way.
    exchange_s = sorted(took)[len(took) // 2]
    rng = random.Random(20261201)

    async def wave() -> list[tuple[RecallQuery, Any]]:
        loop = asyncio.get_running_loop()
        # up to twice the channels: callers also wait for a channel, on any machine
        asked = rng.choices(queries, k=rng.randint(1, 2 * CHANNELS + 2))
        tasks = []
        for query in asked:
            if rng.random() < 0.5:  # gives up after a small budget
                budget = rng.uniform(0.0, 2 * exchange_s)
                coro = asyncio.wait_for(remote.recall(query), budget)
            else:
                coro = remote.recall(query)
            task = asyncio.ensure_future(coro)
            if rng.random() < 0.2:  # cancelled from outside, a moment later
                loop.call_later(rng.uniform(0.0, 2 * exchange_s), task.cancel)
            tasks.append(task)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return list(zip(asked, results, strict=True))

    completed = gave_up = 0
    exchanges = counted.exchanges
    for _ in range(60):
        for query, result in run(wave()):
            if isinstance(result, asyncio.CancelledError | TimeoutError):
                gave_up += 1
            elif isinstance(result, BaseException):
                raise result
            else:
                assert_same(result, want[query.text], query.text)
                completed += 1
    # The child never noticed: every search went to it, same process, no restart.
    assert counted.down == 0
    run(asyncio.sleep(0.3))  # the abandoned exchanges finish on their own
    status = remote.search_status()
    assert status is not None and status["up"] and status["pid"] == pid
    assert status["restarts"] == 0
    # And the storm had teeth: callers that left while their exchange with the child
    # was under way (its answer then arrived for nobody), and ones that left while
    # waiting for a channel.
    assert completed > 20 and gave_up > 20
    abandoned = counted.exchanges - exchanges - completed
    assert abandoned > 5 and counted.cancelled > abandoned
    # No channel lost or left holding an answer: more recalls than channels, one at a
    # time and all at once, each answered by the child, each with its own answer.
    ok = counted.ok
    for query in queries[: 2 * CHANNELS + 1]:
        got = run(asyncio.wait_for(remote.recall(query), 10))
        assert_same(got, want[query.text], query.text)

    async def all_at_once() -> list[list[Recalled]]:
        return list(await asyncio.gather(*(remote.recall(q) for q in queries)))

    for query, got in zip(queries, run(asyncio.wait_for(all_at_once(), 20)), strict=True):
        assert_same(got, want[query.text], query.text)
    assert counted.ok == ok + 2 * CHANNELS + 1 + len(queries)
    assert counted.down == 0


# -- another event loop ---------------------------------------------------------------


def test_a_recall_from_another_loop_searches_in_process(world: World) -> None:
    """The child's streams live on the loop that started it: a recall from another loop
    (a thread of its own) searches in-process, with the same answer."""
    query = SAME_ANSWER_QUERIES[1]
    want = world.run(world.plain.recall(query))
    ok, down = world.counted.ok, world.counted.down
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(asyncio.run(world.remote.recall(query))))
    thread.start()
    thread.join(30)
    assert len(got) == 1
    assert_same(got[0], want, query)
    assert (world.counted.ok, world.counted.down) == (ok, down)  # the child was not asked
    assert_same(world.run(world.remote.recall(query)), want, query)  # and still is, here
    assert world.counted.ok == ok + 1


# -- 6. no orphan --------------------------------------------------------------------


def test_close_leaves_no_child(world: World, embedder: Any) -> None:
    run = world.run
    store = run(SQLiteStore.open(world.db, embedder, search_process=True))
    pid = store.search_status()["pid"]  # type: ignore[index]
    assert not pid_gone(pid)
    started = time.monotonic()
    run(store.close())
    assert time.monotonic() - started < 4  # it left on its own, not killed after a wait
    assert wait_until(lambda: pid_gone(pid), 5)
    status = store.search_status()
    assert status is not None and not status["up"] and status["pid"] is None


PARENT = textwrap.dedent(
    """
    import asyncio, sys
    from memory_core import FastEmbedEmbedder, SQLiteStore

    async def main():
        store = await SQLiteStore.open(sys.argv[1], FastEmbedEmbedder(), search_process=True)
        print(store.search_status()["pid"], flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def test_a_killed_parent_leaves_no_child(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "memory.db")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    child = None
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not pid_gone(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert wait_until(lambda: pid_gone(child), 5)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child is not None and not pid_gone(child):
            os.kill(child, signal.SIGKILL)  # the orphan this test found


def test_the_child_imports_the_package_from_where_the_parent_did(tmp_path: Path) -> None:
    """A parent run as `python -c` in a checkout imports memrelay from the working
    directory ('' on sys.path); its child must too, not another installed copy."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "memory.db")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    child = None
    try:
        assert parent.stdout is not None and parent.stderr is not None
        line = parent.stdout.readline()
        if not line.strip().isdigit():
            parent.kill()
            raise AssertionError("the store did not open:\n" + parent.stderr.read()[-2000:])
        child = int(line)
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        path = next(v for v in environ if v.startswith(b"PYTHONPATH=")).split(b"=", 1)[1]
        assert str(ROOT).encode() in path.split(os.pathsep.encode())
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        if child is not None:
            assert wait_until(lambda: pid_gone(child), 5)


# -- 7. through the proxy ------------------------------------------------------------


def test_the_proxy_recalls_through_the_child(memory_proxy: Any, fake: Any) -> None:
    made: list[tuple[SQLiteStore, Counted]] = []

    def store_class(path: Any, model: Any) -> SQLiteStore:
        store = SQLiteStore(path, model, search_process=True)
        made.append((store, count_searches(store)))
        return store

    server, seed = memory_proxy(store_class=store_class)
    seed.add("acme", "default", "The user lives in Paris")
    client = openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="sk-test",
        max_retries=0,
        default_headers={"X-Memrelay-Tenant": "acme"},
    )
    response = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Where do I live?"}]
    )
    assert response.headers["x-memrelay-recall-status"] == "ok"
    assert response.headers["x-memrelay-recalled"] == "1"
    system = fake.chat_requests()[-1].json()["messages"][0]
    assert system["role"] == "system" and "- The user lives in Paris" in system["content"]
    [(store, counted)] = made
    assert counted.ok == 1 and counted.down == 0
    status = store.search_status()
    assert status is not None and status["up"]
    # The server's shutdown takes its child with it.
    server.__exit__(None, None, None)
    assert wait_until(lambda: pid_gone(status["pid"]), 5)


def search_children(db: Path) -> list[int]:
    """This process's children that are search processes of `db`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"memory_core.sqlite.search_worker" in argv:
            if str(db).encode() in argv:
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("on", [True, False])
def test_serve_on_sqlite_searches_in_a_child_by_default(
    tmp_path: Path, fake_url: str, on: bool
) -> None:
    """The proxy built from settings alone (as `serve` builds it): the setting is on by
    default and reaches the SQLite store; off, no child."""
    from proxy.settings import Settings
    from proxy.wiring import build_app
    from tests.servers import ServedApp

    db = tmp_path / "memory.db"
    options = {} if on else {"search_process": False}
    settings = Settings(upstream_url=fake_url, db=db, extraction_workers=0, **options)
    assert Settings.model_fields["search_process"].default is True
    with ServedApp(build_app(settings)) as served:
        children = search_children(db)
        assert len(children) == (1 if on else 0)

        def metric(name: str) -> float | None:
            for line in httpx.get(served.url + "/metrics").text.splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
            return None

        if not on:
            assert metric("memrelay_search_process_up") is None
        else:  # the health is visible: up, and a kill -9 counted and repaired
            assert metric("memrelay_search_process_up") == 1.0
            assert metric("memrelay_search_process_restarts_total") == 0.0
            os.kill(children[0], signal.SIGKILL)
            assert wait_until(lambda: metric("memrelay_search_process_restarts_total") == 1.0, 10)
            assert wait_until(lambda: metric("memrelay_search_process_up") == 1.0, 10)
            children = search_children(db)
            assert len(children) == 1
    assert all(wait_until(lambda pid=pid: pid_gone(pid), 5) for pid in children)


def test_a_child_that_cannot_start_leaves_the_store_searching_in_process(
    world: World, embedder: Any, tmp_path: Path
) -> None:
    """The child cannot open its database (a folder that does not exist): the store
    still opens, recall answers in-process, the status says down, and the supervisor
    keeps trying without ending."""
    from memory_core.sqlite.search_process import SearchProcess

    run = world.run
    store = run(SQLiteStore.open(world.db, embedder, search_process=True))
    try:
        broken = SearchProcess(tmp_path / "no-such-folder" / "x.db", "m", 384)
        run(broken.start())  # logs, does not raise
        assert broken.status()["up"] is False and broken.status()["pid"] is None
        with pytest.raises(SearchProcessDown):
            run(broken.search(None))  # type: ignore[arg-type]
        run(asyncio.sleep(0.7))  # the supervisor's first retry fails the same way
        assert broken._supervisor is not None and not broken._supervisor.done()
        run(broken.close())
        query = SAME_ANSWER_QUERIES[0]
        run(store._search.close())  # type: ignore[union-attr]
        store._search = broken  # a store whose child never came up
        assert_same(run(store.recall(query)), run(world.plain.recall(query)), query)
    finally:
        run(store.close())
