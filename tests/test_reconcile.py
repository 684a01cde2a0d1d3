"""Reconciliation rules on a real store, without a model (or with its answers scripted)."""

from __future__ import annotations

from extraction.facts import Fact
from extraction.reconcile import Reconciler


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
