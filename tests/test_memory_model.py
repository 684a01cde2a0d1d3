"""The lifecycle table, derived severity, and id validation."""

from __future__ import annotations

import itertools

import pytest

from memory_core import InvalidInput, InvalidTransition, NewMemory, severity_of
from memory_core.model import STATUSES, check_transition, normalise_slot, validate_id

ALLOWED = {
    ("active", "superseded"),
    ("active", "forgotten"),
    ("active", "expired"),
    ("superseded", "forgotten"),
    ("expired", "forgotten"),
}


@pytest.mark.parametrize(("current", "new"), list(itertools.product(STATUSES, STATUSES)))
def test_only_listed_transitions_are_allowed(current, new):
    if (current, new) in ALLOWED:
        check_transition(current, new)
    else:
        with pytest.raises(InvalidTransition, match=f"{current!r} to {new!r}"):
            check_transition(current, new)


@pytest.mark.parametrize(
    ("kind", "severity"),
    [
        ("constraint", "critical"),
        ("error", "antipattern"),
        ("fact", "context"),
        ("preference", "context"),
        ("goal", "context"),
        ("note", "context"),
    ],
)
def test_severity_is_derived_from_kind(kind, severity):
    assert severity_of(kind) == severity


@pytest.mark.parametrize("good", ["a", "acme", "team.alpha:prod-1_x", "x" * 128])
def test_valid_ids(good):
    assert validate_id(good, "tenant") == good


@pytest.mark.parametrize("bad", ["", "x" * 129, "with space", "a/b", "ünï", None, 5, "a\nb"])
def test_invalid_ids_are_clear_errors(bad):
    with pytest.raises(InvalidInput, match="tenant id"):
        validate_id(bad, "tenant")


def test_slots_normalise():
    assert normalise_slot("  Email Tone ") == "email_tone"
    assert normalise_slot("email-tone") == "email_tone"
    assert normalise_slot(None) is None


@pytest.mark.parametrize(
    ("memory", "needle"),
    [
        (NewMemory(""), "non-empty"),
        (NewMemory("   \n "), "non-empty"),
        (NewMemory("x", kind="opinion"), "kind"),
        (NewMemory("x", source="robot"), "source"),
        (NewMemory("x", confidence=1.5), "confidence"),
        (NewMemory("x" * 9000), "longer"),
    ],
)
def test_new_memory_validation(memory, needle):
    with pytest.raises(InvalidInput, match=needle):
        memory.validated()
