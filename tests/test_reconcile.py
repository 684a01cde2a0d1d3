"""Reconciliation rules on a real store, without a model (or with its answers scripted)."""

from __future__ import annotations

import re

import pytest

from extraction import forget_words
from extraction.facts import Fact
from extraction.reconcile import Reconciler
from tests.text_checks import without_generated_ids


def test_numbers_and_names_make_different_facts(store, run):
    reconciler = Reconciler(store, None)
    first = run(
        reconciler.apply("acme", "default", Fact("The user's door code is 4711"), {"job_id": "a"})
    )
    second = run(
        reconciler.apply("acme", "default", Fact("The user's door code is 9832"), {"job_id": "b"})
    )
    assert first.action == "added" and second.action == "added"


def test_slot_change_supersedes_and_same_value_reinforces(store, run):
    reconciler = Reconciler(store, None)
    a = run(
        reconciler.apply(
            "acme",
            "default",
            Fact("The user lives in Oslo", subject="user", attribute="city", value="Oslo"),
            {"job_id": "1"},
        )
    )
    b = run(
        reconciler.apply(
            "acme",
            "default",
            Fact("User's home city: oslo", subject="User", attribute="City", value="oslo"),
            {"job_id": "2"},
        )
    )
    c = run(
        reconciler.apply(
            "acme",
            "default",
            Fact("The user moved to Bergen", subject="user", attribute="city", value="Bergen"),
            {"job_id": "3"},
        )
    )
    assert (a.action, b.action, c.action) == ("added", "reinforced", "superseded")
    assert c.old_ids == [a.memory_id]
    again = run(
        reconciler.apply(
            "acme",
            "default",
            Fact("The user moved to Bergen", subject="user", attribute="city", value="Bergen"),
            {"job_id": "3"},
        )
    )
    assert again.action == "unchanged"


def test_assistant_never_supersedes_user_but_user_supersedes_assistant(store, run):
    reconciler = Reconciler(store, None)
    user = run(
        reconciler.apply(
            "acme",
            "default",
            Fact("The user is vegetarian", subject="user", attribute="diet", value="vegetarian"),
            {},
        )
    )
    claim = run(
        reconciler.apply(
            "acme",
            "default",
            Fact(
                "The user eats fish",
                subject="user",
                attribute="diet",
                value="pescatarian",
                stated_by="assistant",
            ),
            {},
        )
    )
    assert claim.action == "rejected" and claim.old_ids == [user.memory_id]
    assistant = run(
        reconciler.apply(
            "acme",
            "other",
            Fact(
                "The meeting is on Monday",
                subject="meeting",
                attribute="day",
                value="Monday",
                stated_by="assistant",
            ),
            {},
        )
    )
    fix = run(
        reconciler.apply(
            "acme",
            "other",
            Fact("The meeting is on Tuesday", subject="meeting", attribute="day", value="Tuesday"),
            {},
        )
    )
    assert fix.action == "superseded" and fix.old_ids == [assistant.memory_id]


# -- issue 15: every related memory, every readable space, chains, guards ------------

import time  # noqa: E402

from extraction.llm import OpenAICompatibleLLM  # noqa: E402
from memory_core import ListQuery, NewMemory  # noqa: E402
from memory_core.recall import RecallQuery  # noqa: E402
from tests.extraction_script import ScriptedExtraction  # noqa: E402


def everything(store, run, tenant="acme"):
    return run(store.list(ListQuery(tenant, statuses=None, limit=1000))).items


def test_forget_erases_every_superseded_version(store, run):
    first = run(store.add("acme", "default", NewMemory("The alarm code is 1122")))
    _, second = run(store.supersede("acme", first.id, NewMemory("The alarm code is 3344"), "new"))
    _, third = run(store.supersede("acme", second.id, NewMemory("The alarm code is 5566"), "new"))
    other = run(store.add("acme", "default", NewMemory("The user likes jazz")))
    run(store.forget("acme", third.id, "forgotten at the user's request", actor="admin"))
    by_id = {m.id: m for m in everything(store, run)}
    for memory_id in (first.id, second.id, third.id):
        memory = by_id[memory_id]
        assert memory.status == "forgotten" and memory.content is None and memory.value is None
    assert by_id[other.id].status == "active"
    dump = "".join(run(_collect(store.export("acme"))))
    # Random ids (hex) and times (floats) may contain the digits by chance; what must
    # not hold them is everything else.
    dump = re.sub(r"\d+\.\d+|(?:mem_)?[0-9a-f]{24,}", "", dump)
    assert "1122" not in dump and "3344" not in dump and "5566" not in dump
    history = run(store.history("acme", first.id))
    assert history[-1].action == "forgotten" and history[-1].detail["with"] == third.id
    recalled = run(store.recall(RecallQuery("acme", ["default"], "alarm code 1122")))
    assert [r.memory.id for r in recalled] == [other.id]


async def _collect(lines):
    return [line async for line in lines]


def test_chat_forget_stores_no_user_words(store, run):
    """Issue 13, point 3: reasons and events are fixed text plus ids."""
    reconciler = Reconciler(store, None)
    pin = run(store.add("acme", "default", NewMemory("The user's PIN is 4711")))
    outcomes = run(reconciler.forget_request("acme", ["default"], "my PIN is 4711", job_id="job_1"))
    assert [o.action for o in outcomes] == ["forgotten"]
    forgotten = run(store.get("acme", pin.id))
    assert forgotten.status == "forgotten"
    for text in [forgotten.status_reason] + [
        f"{e.reason} {e.detail}" for e in run(store.history("acme", pin.id))
    ]:
        assert "4711" not in without_generated_ids(text or "") and "PIN" not in (text or "")
    assert "4711" not in without_generated_ids(str([o.as_dict() for o in outcomes]))


def test_forget_request_reaches_every_readable_space(store, run):
    reconciler = Reconciler(store, None)
    code = run(store.add("acme", "personal", NewMemory("The user's locker code is 5521")))
    outcomes = run(reconciler.forget_request("acme", ["work", "personal"], "my locker code"))
    assert [(o.action, o.spaces) for o in outcomes] == [("forgotten", {code.id: "personal"})]
    events = [e for e in run(store.events("acme")) if e.action == "forgotten"]
    assert [e.space for e in events] == ["personal"]


def test_forget_request_reaches_every_match_however_it_ranks(store, run, monkeypatch):
    """A large tenant: every memory holding all the request's words goes, not only the
    FORGET_MAX best recalled; memories missing a word, or in a space the request
    cannot read, stay. Small pages, so the sweep pages while it forgets."""
    monkeypatch.setattr(forget_words, "FORGET_PAGE", 4)
    reconciler = Reconciler(store, None)
    codes = [f"The user's locker code at gym {n} is {4000 + n}" for n in range(18)]
    mine = run(store.add_many("acme", "personal", [NewMemory(c) for c in codes]))
    codes = ["For work: the office locker codes change monthly, this month 8812"]
    mine += run(store.add_many("acme", "work", [NewMemory(c) for c in codes]))
    kept = ["The user's locker is blue", "The user's door code is 1234"]
    kept += [f"The user likes hiking trail number {n}" for n in range(30)]
    kept = run(store.add_many("acme", "personal", [NewMemory(c) for c in kept]))
    elsewhere = run(store.add("acme", "gym", NewMemory("The user's locker code at gym 99 is 1")))
    other = run(store.add("globex", "personal", NewMemory("The user's locker code is 5")))
    outcomes = run(
        reconciler.forget_request("acme", ["work", "personal"], "my locker code", None, "j")
    )
    assert sorted(o.old_ids[0] for o in outcomes if o.action == "forgotten") == sorted(
        m.id for m in mine
    )
    for memory in mine:
        assert run(store.get("acme", memory.id)).status == "forgotten"
    for memory in [*kept, elsewhere]:
        assert run(store.get("acme", memory.id)).status == "active"
    assert run(store.get("globex", other.id)).status == "active"


def test_update_in_another_readable_space_supersedes_there(store, run):
    reconciler = Reconciler(store, None)
    lisbon = Fact("The user lives in Lisbon", subject="user", attribute="city", value="Lisbon")
    first = run(reconciler.apply("acme", "personal", lisbon, {"job_id": "1"}))
    porto = Fact("The user lives in Porto", subject="user", attribute="city", value="Porto")
    moved = run(
        reconciler.apply("acme", "work", porto, {"job_id": "2"}, spaces=["work", "personal"])
    )
    assert moved.action == "superseded" and moved.old_ids == [first.memory_id]
    assert moved.spaces[first.memory_id] == "personal"
    # Without the read spaces (the old behaviour), the other space is not touched.
    only = run(
        reconciler.apply(
            "acme",
            "work",
            Fact("The user lives in Faro", subject="user", attribute="city", value="Faro"),
            {"job_id": "3"},
        )
    )
    assert only.action == "added"


def test_one_fact_supersedes_every_memory_it_updates(store, run):
    reconciler = Reconciler(store, None)
    nurse = run(store.add("acme", "default", NewMemory("The user works as a nurse")))
    nights = run(store.add("acme", "default", NewMemory("The user works night shifts")))
    jazz = run(store.add("acme", "default", NewMemory("The user likes jazz")))
    shown = {"m1": nurse, "m2": nights, "m3": jazz}
    fact = Fact("The user is a software developer", action="update", memory_ids=["m1", "m2", "m9"])
    outcome = run(reconciler.apply("acme", "default", fact, {"job_id": "x"}, shown=shown))
    assert outcome.action == "superseded" and sorted(outcome.old_ids) == sorted(
        [nurse.id, nights.id]
    )
    active = {m.content for m in run(store.list(ListQuery("acme", limit=100))).items}
    assert active == {"The user is a software developer", "The user likes jazz"}


def test_every_memory_in_the_slot_is_superseded(store, run):
    reconciler = Reconciler(store, None)
    for space in ("a", "b"):
        run(
            store.add(
                "acme",
                space,
                NewMemory(
                    "The user's city is " + space, subject="user", attribute="city", value=space
                ),
            )
        )
    fact = Fact("The user lives in Rome", subject="user", attribute="city", value="Rome")
    outcome = run(reconciler.apply("acme", "a", fact, {"job_id": "r"}, spaces=["a", "b"]))
    assert outcome.action == "superseded" and len(outcome.old_ids) == 2


def test_confirmed_assistant_fact_becomes_the_users(store, run):
    reconciler = Reconciler(store, None)
    slot = {"subject": "user", "attribute": "dentist", "value": "Tuesday"}
    claim = Fact("The dentist appointment is on Tuesday", stated_by="assistant", **slot)
    first = run(
        reconciler.apply("acme", "default", claim, {"job_id": "1", "stated_by": "assistant"})
    )
    assert run(store.get("acme", first.memory_id)).source == "assistant"
    confirm = Fact("The dentist appointment is on Tuesday", stated_by="user", **slot)
    again = run(reconciler.apply("acme", "default", confirm, {"job_id": "2"}))
    assert again.action == "reinforced"
    confirmed = run(store.get("acme", first.memory_id))
    assert confirmed.source == "user"
    history = run(store.history("acme", first.memory_id))
    assert history[-1].detail["source_before"] == "assistant"
    later = Fact(
        "The dentist appointment is on Wednesday",
        subject="user",
        attribute="dentist",
        value="Wednesday",
        stated_by="assistant",
    )
    rejected = run(reconciler.apply("acme", "default", later, {"job_id": "3"}))
    assert rejected.action == "rejected" and rejected.old_ids == [first.memory_id]


def test_assistant_proposal_cannot_retire_or_update_a_user_memory(store, run):
    reconciler = Reconciler(store, None)
    mine = run(store.add("acme", "default", NewMemory("The user owns a boat")))
    claim = Fact(
        "The user sold the boat", stated_by="assistant", action="update", memory_ids=["m1"]
    )
    outcome = run(reconciler.apply("acme", "default", claim, {}, shown={"m1": mine}))
    assert outcome.action == "rejected"
    assert run(reconciler.retire("acme", mine, "j", stated_by="assistant")).action == "rejected"
    assert run(store.get("acme", mine.id)).status == "active"
    assert run(reconciler.retire("acme", mine, "j")).action == "retired"
    retired = run(store.get("acme", mine.id))
    assert retired.status == "expired" and "boat" not in retired.status_reason


def test_expired_memories_are_never_recalled(store, run):
    run(
        store.add(
            "acme", "default", NewMemory("The user is on vacation", expires_at=time.time() - 1)
        )
    )
    run(store.add("acme", "default", NewMemory("The user likes vacation photos")))
    results = run(store.recall(RecallQuery("acme", ["default"], "vacation", min_similarity=-1)))
    assert [r.memory.content for r in results] == ["The user likes vacation photos"]


def test_judge_sees_every_close_memory_and_can_say_same(store, run, fake, fake_url):
    scripted = ScriptedExtraction()
    scripted.relation = "same"
    fake.responder = scripted
    llm = OpenAICompatibleLLM(fake_url, model="m", max_wait=0.01)
    reconciler = Reconciler(store, llm)
    first = run(store.add("acme", "default", NewMemory("The user is allergic to peanuts")))
    second = run(store.add("acme", "default", NewMemory("The user has an allergy to peanuts")))
    outcome = run(
        reconciler.apply(
            "acme", "default", Fact("Peanuts give the user an allergic reaction"), {"job_id": "p"}
        )
    )
    run(llm.aclose())
    assert outcome.action == "reinforced" and outcome.memory_id in (first.id, second.id)
    judged = [c for c in scripted.calls if "You compare" in c["messages"][0]["content"]]
    assert len(judged) == 1
    import json

    shown = json.loads(judged[0]["messages"][1]["content"])["existing_memories"]
    assert len(shown) == 2
    assert len(run(store.list(ListQuery("acme", limit=10))).items) == 2


def _dead_job(jobs, run, tenant, space, payload, job_id):
    """A job that failed its only attempt: dead-lettered, its payload kept for a retry."""
    run(jobs.enqueue(tenant, space, payload, job_id=job_id, max_attempts=1))
    assert run(jobs.claim("w", 30)).id == job_id
    assert run(jobs.fail(job_id, "w", "model exploded", retry_in=0)).status == "dead"


def _jobs_table(store, run):
    """Every column of every row of the jobs table, as text."""
    if store.backend == "postgres":
        return str(run(store.fetch("SELECT * FROM jobs")))
    return str(run(store.run_read(lambda c: c.execute("SELECT * FROM jobs").fetchall())))


def test_a_forget_in_words_erases_the_dead_jobs_that_hold_it(store, run):
    """ "forget my locker code" erases the text of every dead job of the tenant, in the
    spaces it reaches, whose exchange holds locker and code (in any turn): retrying one
    would learn the code again. The row stays, a retry is refused. A dead job missing a
    word, of another tenant, or in a space the forget cannot reach keeps its text and
    can still be retried."""
    from memory_core import InvalidInput
    from memory_core.backends import jobs_for

    jobs = jobs_for(store)
    _dead_job(jobs, run, "acme", "personal", {"user": "My locker code is 5521"}, "code")
    earlier = {
        "user": "thanks, noted",
        "context": {"earlier_turns": [{"role": "user", "text": "Locker codes: mine is 6633"}]},
    }
    _dead_job(jobs, run, "acme", "work", {**earlier, "assistant": "ok"}, "turns")
    _dead_job(jobs, run, "acme", "personal", {"user": "My locker is blue, 4242"}, "partial")
    _dead_job(jobs, run, "globex", "personal", {"user": "My locker code is 7777"}, "other")
    _dead_job(jobs, run, "acme", "gym", {"user": "My locker code is 9911"}, "elsewhere")
    reconciler = Reconciler(store, None, jobs=jobs)
    run(reconciler.forget_request("acme", ["work", "personal"], "my locker code", None, "jf"))
    for job_id in ("code", "turns"):
        job = run(jobs.get_job("acme", job_id))
        assert job.status == "dead" and job.payload is None
        assert job.last_error == "payload erased by a forget request (job jf)"
        with pytest.raises(InvalidInput, match="erased by a forget"):
            run(jobs.retry("acme", job_id))
        assert run(jobs.get_job("acme", job_id)).status == "dead"
    table = _jobs_table(store, run)
    table = without_generated_ids(table)
    assert "5521" not in table and "6633" not in table
    for number in ("4242", "7777", "9911"):
        assert number in table
    for tenant, job_id in (("acme", "partial"), ("globex", "other"), ("acme", "elsewhere")):
        assert run(jobs.get_job(tenant, job_id)).payload is not None
        assert run(jobs.retry(tenant, job_id)).status == "pending"
