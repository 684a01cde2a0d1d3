"""The explicit-request grammar (extraction/commands.py), the extractor's context
(proxy/memory/conversation.py) and the reading of temporary facts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from extraction.commands import asks_to_forget, parse_commands, third_person
from extraction.facts import read_expiry, read_extraction
from proxy.memory.conversation import learning_context


@pytest.mark.parametrize(
    ("text", "remembered"),
    [
        ("Please remember that I live in Munich.", [("The user lives in Munich", "fact")]),
        ("remember: my wife is called Ana", [("The user's wife is called Ana", "fact")]),
        ("Please note that I prefer tea.", [("The user prefers tea", "preference")]),
        ("Keep in mind I study physics", [("The user studies physics", "fact")]),
        ("Can you remember that I'm left-handed?", [("The user is left-handed", "fact")]),
        ("Remember to always answer in French.", [("Always answer in French", "constraint")]),
        ("Hi! Remember that I have two cats. Thanks", [("The user has two cats", "fact")]),
        (
            "Merk dir, dass mein Hund Bello heißt.",
            [("The user asked to remember: mein Hund Bello heißt", "note")],
        ),
        ("Souviens-toi que j'aime le thé", [("The user asked to remember: j'aime le thé", "note")]),
        ("Recuerda que soy vegetariano", [("The user asked to remember: soy vegetariano", "note")]),
        (
            "Lembra que eu moro em Lisboa",
            [("The user asked to remember: eu moro em Lisboa", "note")],
        ),
        ("Remember when we met in Paris?", []),
        ("I remember that day well.", []),
        ("Don't forget to buy milk", []),
        ("What's the weather like?", []),
    ],
)
def test_remember_requests(text, remembered):
    commands = parse_commands(text)
    assert commands.remember == remembered and commands.forget == []


@pytest.mark.parametrize(
    ("text", "forget"),
    [
        ("Forget my alarm code.", ["my alarm code"]),
        ("Please forget what I said about my salary", ["my salary"]),
        ("Can you forget my address?", ["my address"]),
        ("forget that I smoke", ["that I smoke"]),
        ("Vergiss meine Adresse", ["meine Adresse"]),
        ("Oublie mon adresse.", ["mon adresse"]),
        ("Olvida mi dirección", ["mi dirección"]),
        ("Esquece o meu endereço", ["o meu endereço"]),
        ("Esqueça que eu fumo", ["eu fumo"]),
        ("OLVÍDATE DE MI DIRECCIÓN", ["MI DIRECCIÓN"]),
        ("OUBLIE mon adresse", ["mon adresse"]),
        ("I forgot my keys", []),
        ("forget it", []),
        ("Don't forget that I'm vegan", []),
    ],
)
def test_forget_requests(text, forget):
    assert parse_commands(text).forget == forget
    # The cheap check run on every chat (the job then waits for earlier ones) agrees.
    assert asks_to_forget(text) is bool(forget)


def test_third_person_rewrite():
    assert third_person("I live in Munich and my cat is Tom") == (
        "the user lives in Munich and the user's cat is Tom"
    )
    assert third_person("I don't eat meat") == "the user doesn't eat meat"
    assert third_person("I can swim") == "the user can swim"


def test_learning_context_holds_the_turn_answered_and_a_bounded_window():
    messages = [{"role": "system", "content": "be nice"}]
    for i in range(10):
        messages += [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": f"answer {i} " + "x" * 900},
        ]
    messages[-1] = {"role": "assistant", "content": "Which city do you live in now?"}
    messages.append({"role": "user", "content": "Munich."})
    context = learning_context(messages, ("work", "personal"))
    assert context["previous_assistant"] == "Which city do you live in now?"
    assert context["read_spaces"] == ["work", "personal"]
    turns = context["earlier_turns"]
    assert 1 <= len(turns) <= 6 and turns[-1] == {"role": "user", "text": "question 9"}
    assert sum(len(t["text"]) for t in turns) <= 3000
    assert all(len(t["text"]) <= 600 for t in turns)
    assert "be nice" not in str(turns)


def test_expiry_is_read_and_bounded():
    now = 1_800_000_000.0
    end_of_day = read_expiry("2027-01-15", now)
    assert end_of_day is not None and 0 < end_of_day - 1_800_000_000 < 10**8
    at_six = datetime(2027, 1, 15, 18, tzinfo=UTC).timestamp()
    assert read_expiry("2027-01-15T18:00:00Z", now) == at_six
    assert end_of_day == datetime(2027, 1, 15, 23, 59, 59, 999999, tzinfo=UTC).timestamp()
    for bad in ("1e999", float("inf"), "soon", "3026-01-01", True, -5):
        assert read_expiry(bad, now) is None
    extraction = read_extraction(
        {"facts": [{"content": "The user is on vacation", "expires_at": "2027-01-15"}]}, now
    )
    assert extraction.facts[0].expires_at == end_of_day
