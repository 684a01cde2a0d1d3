"""Multi-turn memory scenarios: what a user says, what a perfect extraction model would
answer, and what must (and must not) reach the upstream's system message afterwards.

Each turn names the facts a perfect model extracts from it. `refs` are words of the
existing memories the fact updates (or repeats, for action "same"): the scripted model
(tests/perfect_model.py) finds them among the memories memrelay SHOWED it and answers
with their short ids; a memory memrelay did not show cannot be referred to. `needs`
is context the model must have been given to understand the turn (the assistant's
question before "Munich."); without it the scripted model extracts nothing.
`model_silent` turns are ones a weak model misses entirely: only the explicit-request
grammar can learn from them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.text_checks import without_generated_ids


@dataclass
class F:
    """One fact the perfect model extracts."""

    content: str
    kind: str = "fact"
    slot: tuple[str, str, str] | None = None  # subject, attribute, value
    by: str = "user"
    action: str = "add"
    refs: list[str] = field(default_factory=list)
    expires_in_s: float | None = None  # temporary: expires this many seconds from now
    expires_date: str | None = None  # temporary: expires at the end of this date


@dataclass
class Turn:
    user: str
    reply: str = "Noted."
    facts: list[F] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # words of memories no longer true
    forget: list[str] = field(default_factory=list)  # words of memories to forget
    needs: str | None = None  # context (earlier turns / previous assistant) required
    write: str | None = None  # X-Memrelay-Write-Space
    read: str | None = None  # X-Memrelay-Read-Spaces
    model_silent: bool = False


@dataclass
class Scenario:
    name: str
    category: str
    turns: list[Turn]
    question: str
    expect: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    read: str | None = None  # read spaces of the question
    wait_s: float = 0.0  # pause before the question (expiry)
    check: Callable[[Any], None] | None = None  # extra checks through the admin API
    explicit: bool = False  # learnable from the explicit-request grammar alone


def _stored_text(export: str) -> str:
    """What the export says in words: every key and string of every record (memories
    of any status, their events and provenance), generated ids blanked. Numbers (times,
    confidences) are left out: memrelay stores what a user said as text."""
    parts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            parts.append(without_generated_ids(value))
        elif isinstance(value, dict):
            for key, item in value.items():
                parts.append(str(key))
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for line in export.splitlines():
        if line.strip():
            walk(json.loads(line))
    return "\n".join(parts)


def _no_text_anywhere(*needles: str) -> Callable[[Any], None]:
    """Neither the memories (any status) nor their events hold these strings as text."""

    def check(api: Any) -> None:
        text = _stored_text(api.export_text())
        for needle in needles:
            assert needle not in text, f"{needle!r} still stored"

    return check


def _status_of(words: str, status: str) -> Callable[[Any], None]:
    def check(api: Any) -> None:
        found = [m for m in api.memories() if m["content"] and words in m["content"]]
        assert found and all(m["status"] == status for m in found), found

    return check


def _one_active_reinforced(words: str) -> Callable[[Any], None]:
    def check(api: Any) -> None:
        active = [m for m in api.memories("active") if words in (m["content"] or "")]
        assert len(active) == 1 and active[0]["confidence"] > 0.9, active

    return check


def _one_active(words: str) -> Callable[[Any], None]:
    def check(api: Any) -> None:
        active = [m for m in api.memories("active") if words in (m["content"] or "")]
        assert len(active) == 1, active

    return check


def _source_is_user(words: str) -> Callable[[Any], None]:
    def check(api: Any) -> None:
        active = [m for m in api.memories("active") if words in (m["content"] or "")]
        assert active and all(m["source"] == "user" for m in active), active

    return check


def _expires_set(words: str) -> Callable[[Any], None]:
    def check(api: Any) -> None:
        active = [m for m in api.memories("active") if words in (m["content"] or "")]
        assert active and all(m["expires_at"] for m in active), active

    return check


def _events_name_spaces(*spaces: str) -> Callable[[Any], None]:
    def check(api: Any) -> None:
        touched = {e["space"] for e in api.events() if e["action"] in ("superseded", "forgotten")}
        assert set(spaces) <= touched, touched

    return check


SCENARIOS: list[Scenario] = [
    Scenario(
        "negation across slots",
        "negation",
        [
            Turn(
                "I love steak, medium rare.",
                facts=[
                    F("The user loves steak", "preference", ("user", "favourite_food", "steak"))
                ],
            ),
            Turn(
                "I don't eat meat any more, I'm vegetarian now.",
                facts=[
                    F(
                        "The user is vegetarian and does not eat meat",
                        slot=("user", "diet", "vegetarian"),
                        action="update",
                        refs=["steak"],
                    )
                ],
            ),
        ],
        "What should I cook for dinner tonight?",
        expect=["vegetarian"],
        absent=["steak"],
    ),
    Scenario(
        "career change expires related facts",
        "one change, many facts",
        [
            Turn(
                "I work as a nurse.",
                facts=[F("The user works as a nurse", slot=("user", "job", "nurse"))],
            ),
            Turn(
                "I work night shifts at the hospital.",
                facts=[
                    F("The user works night shifts", slot=("user", "work_schedule", "night shifts"))
                ],
            ),
            Turn(
                "I quit nursing, I'm a software developer now.",
                facts=[
                    F(
                        "The user works as a software developer",
                        slot=("user", "job", "software developer"),
                        action="update",
                        refs=["nurse", "night shifts"],
                    )
                ],
            ),
        ],
        "Help me plan my week.",
        expect=["software developer"],
        absent=["nurse", "night shifts"],
    ),
    Scenario(
        "quitting coffee",
        "one change, many facts",
        [
            Turn(
                "I drink coffee every morning.",
                facts=[F("The user drinks coffee every morning", "preference")],
            ),
            Turn(
                "I take my coffee with oat milk.",
                facts=[F("The user takes coffee with oat milk", "preference")],
            ),
            Turn(
                "I've quit coffee completely.",
                facts=[
                    F(
                        "The user has quit coffee",
                        action="update",
                        refs=["every morning", "oat milk"],
                    )
                ],
            ),
        ],
        "What should I drink at breakfast?",
        expect=["quit coffee"],
        absent=["oat milk", "every morning"],
    ),
    Scenario(
        "short answer to the assistant's question",
        "short answers",
        [
            Turn("Can you help me find a gym?", reply="Sure! Which city do you live in now?"),
            Turn(
                "Munich.",
                facts=[F("The user lives in Munich", slot=("user", "city", "Munich"))],
                needs="Which city do you live in now?",
            ),
        ],
        "Recommend a bakery near me.",
        expect=["Munich"],
    ),
    Scenario(
        "a detail that needs earlier turns",
        "short answers",
        [
            Turn("I'm planning a trip to Japan.", reply="Exciting! When are you going?"),
            Turn("Something about cherry blossoms, I think.", reply="Lovely. Which month?"),
            Turn(
                "April.",
                facts=[F("The user plans a trip to Japan in April", "goal")],
                needs="trip to Japan",
            ),
        ],
        "What should I pack?",
        expect=["Japan in April"],
    ),
    Scenario(
        "assistant cannot override what the user confirmed",
        "confirmation",
        [
            Turn(
                "When is my dentist appointment?",
                reply="Your dentist appointment is on Tuesday.",
                facts=[
                    F(
                        "The user's dentist appointment is on Tuesday",
                        slot=("user", "dentist_appointment", "Tuesday"),
                        by="assistant",
                    )
                ],
            ),
            Turn(
                "Yes, that's right.",
                facts=[
                    F(
                        "The user's dentist appointment is on Tuesday",
                        slot=("user", "dentist_appointment", "Tuesday"),
                        action="same",
                        refs=["Tuesday"],
                    )
                ],
                needs="Tuesday",
            ),
            Turn(
                "Remind me which day again.",
                reply="Your dentist appointment is on Wednesday.",
                facts=[
                    F(
                        "The user's dentist appointment is on Wednesday",
                        slot=("user", "dentist_appointment", "Wednesday"),
                        by="assistant",
                        action="update",
                        refs=["Tuesday"],
                    )
                ],
            ),
        ],
        "Which day do I see the dentist?",
        expect=["Tuesday"],
        absent=["Wednesday"],
        check=_source_is_user("Tuesday"),
    ),
    Scenario(
        "assistant claim against a user fact",
        "confirmation",
        [
            Turn(
                "I live in Lyon.",
                facts=[F("The user lives in Lyon", slot=("user", "city", "Lyon"))],
            ),
            Turn(
                "Any tips for the weekend?",
                reply="Since you live in Marseille, visit the Calanques.",
                facts=[
                    F(
                        "The user lives in Marseille",
                        slot=("user", "city", "Marseille"),
                        by="assistant",
                        action="update",
                        refs=["Lyon"],
                    )
                ],
            ),
        ],
        "Where could I go for a walk?",
        expect=["Lyon"],
        absent=["Marseille"],
    ),
    Scenario(
        "user corrects the assistant",
        "confirmation",
        [
            Turn(
                "What time is my flight?",
                reply="Your flight leaves at 9:00.",
                facts=[
                    F(
                        "The user's flight leaves at 9:00",
                        slot=("user", "flight_time", "9:00"),
                        by="assistant",
                    )
                ],
            ),
            Turn(
                "No, my flight leaves at 11:30.",
                facts=[
                    F(
                        "The user's flight leaves at 11:30",
                        slot=("user", "flight_time", "11:30"),
                        action="update",
                        refs=["9:00"],
                    )
                ],
            ),
        ],
        "When should I leave for the airport?",
        expect=["11:30"],
        absent=["9:00"],
    ),
    Scenario(
        "temporary fact expires",
        "temporary",
        [
            Turn(
                "I'm on a quick coffee break for a moment.",
                facts=[F("The user is on a coffee break", expires_in_s=3)],
            ),
            Turn(
                "I love hiking in the Alps.",
                facts=[F("The user loves hiking in the Alps", "preference")],
            ),
        ],
        "What am I doing right now?",
        expect=["hiking"],
        absent=["coffee break"],
        wait_s=4.0,
    ),
    Scenario(
        "vacation until a date keeps its expiry",
        "temporary",
        [
            Turn(
                "I'm on vacation in Crete until the end of next year.",
                facts=[F("The user is on vacation in Crete", expires_date="+365")],
            )
        ],
        "Where am I?",
        expect=["vacation in Crete"],
        check=_expires_set("Crete"),
    ),
    Scenario(
        "update in another readable space",
        "other spaces",
        [
            Turn(
                "I live in Lisbon.",
                facts=[F("The user lives in Lisbon", slot=("user", "city", "Lisbon"))],
                write="personal",
            ),
            Turn(
                "I moved to Porto last month.",
                facts=[
                    F(
                        "The user lives in Porto",
                        slot=("user", "city", "Porto"),
                        action="update",
                        refs=["Lisbon"],
                    )
                ],
                write="work",
                read="work,personal",
            ),
        ],
        "Where do I live?",
        expect=["Porto"],
        absent=["Lisbon"],
        read="work,personal",
        check=_events_name_spaces("personal"),
    ),
    Scenario(
        "forget in another readable space",
        "other spaces",
        [
            Turn(
                "My locker code is 5521.",
                facts=[F("The user's locker code is 5521", slot=("user", "locker_code", "5521"))],
                write="personal",
            ),
            Turn(
                "Please forget my locker code.",
                forget=["locker code"],
                write="work",
                read="work,personal",
            ),
        ],
        "What is my locker code?",
        absent=["5521"],
        read="work,personal",
        check=_no_text_anywhere("5521"),
    ),
    Scenario(
        "forget erases the whole version chain",
        "forget",
        [
            Turn(
                "My alarm code is 1122.",
                facts=[F("The user's alarm code is 1122", slot=("user", "alarm_code", "1122"))],
            ),
            Turn(
                "I changed my alarm code to 3344.",
                facts=[
                    F(
                        "The user's alarm code is 3344",
                        slot=("user", "alarm_code", "3344"),
                        action="update",
                        refs=["1122"],
                    )
                ],
            ),
            Turn("Forget my alarm code.", forget=["alarm code"]),
        ],
        "What is my alarm code?",
        absent=["1122", "3344"],
        check=_no_text_anywhere("1122", "3344", "alarm"),
    ),
    Scenario(
        "paraphrase reinforces",
        "evidence",
        [
            Turn(
                "I'm allergic to peanuts.",
                facts=[F("The user is allergic to peanuts", "constraint")],
            ),
            Turn(
                "Just so you know, peanuts make me really sick, it's an allergy.",
                facts=[
                    F(
                        "The user has a peanut allergy",
                        "constraint",
                        action="same",
                        refs=["peanuts"],
                    )
                ],
            ),
        ],
        "Suggest a snack.",
        expect=["allergic to peanuts"],
        absent=["peanut allergy"],
        check=_one_active_reinforced("peanut"),
    ),
    Scenario(
        "correction of a correction",
        "corrections",
        [
            Turn(
                "My daughter's name is Mia.",
                facts=[F("The user's daughter is named Mia", slot=("daughter", "name", "Mia"))],
            ),
            Turn(
                "Sorry, typo: her name is Nia.",
                facts=[
                    F(
                        "The user's daughter is named Nia",
                        slot=("daughter", "name", "Nia"),
                        action="update",
                        refs=["Mia"],
                    )
                ],
            ),
            Turn(
                "Ugh, I was right the first time, it's Mia with an M.",
                facts=[
                    F(
                        "The user's daughter is called Mia",
                        slot=("daughter", "name", "Mia"),
                        action="update",
                        refs=["Nia"],
                    )
                ],
            ),
        ],
        "Write a birthday card for my daughter.",
        expect=["Mia"],
        absent=["Nia"],
    ),
    Scenario(
        "two people's facts",
        "people",
        [
            Turn(
                "My wife Ana works as a teacher.",
                facts=[
                    F("Ana, the user's wife, works as a teacher", slot=("ana", "job", "teacher"))
                ],
            ),
            Turn(
                "My brother Tom is a chef.",
                facts=[F("Tom, the user's brother, is a chef", slot=("tom", "job", "chef"))],
            ),
            Turn(
                "Ana just became the school principal!",
                facts=[
                    F(
                        "Ana, the user's wife, is a school principal",
                        slot=("ana", "job", "principal"),
                        action="update",
                        refs=["teacher"],
                    )
                ],
            ),
        ],
        "Gift ideas for my family?",
        expect=["principal", "chef"],
        absent=["teacher"],
    ),
    Scenario(
        "plural preferences accumulate",
        "preferences",
        [
            Turn("I like jazz.", facts=[F("The user likes jazz", "preference")]),
            Turn(
                "I also like classical music.",
                facts=[F("The user likes classical music", "preference")],
            ),
            Turn(
                "Oh and I enjoy bossa nova too.",
                facts=[F("The user enjoys bossa nova", "preference")],
            ),
        ],
        "Make me a playlist.",
        expect=["jazz", "classical", "bossa nova"],
    ),
    Scenario(
        "numbers and units",
        "numbers",
        [
            Turn(
                "I weigh 82 kg.",
                facts=[F("The user weighs 82 kg", slot=("user", "weight", "82 kg"))],
            ),
            Turn(
                "Good news, I'm down to 78 kg now.",
                facts=[
                    F(
                        "The user weighs 78 kg",
                        slot=("user", "weight", "78 kg"),
                        action="update",
                        refs=["82 kg"],
                    )
                ],
            ),
        ],
        "How many calories should I eat?",
        expect=["78 kg"],
        absent=["82 kg"],
    ),
    Scenario(
        "dates change",
        "dates",
        [
            Turn(
                "My passport expires on 2027-03-14.",
                facts=[
                    F(
                        "The user's passport expires on 2027-03-14",
                        slot=("user", "passport_expiry", "2027-03-14"),
                    )
                ],
            ),
            Turn(
                "I renewed my passport, it now expires on 2036-05-01.",
                facts=[
                    F(
                        "The user's passport expires on 2036-05-01",
                        slot=("user", "passport_expiry", "2036-05-01"),
                        action="update",
                        refs=["2027-03-14"],
                    )
                ],
            ),
        ],
        "Can I travel abroad next year?",
        expect=["2036-05-01"],
        absent=["2027-03-14"],
    ),
    Scenario(
        "a fact retracted as a joke",
        "retraction",
        [
            Turn(
                "I own a yacht called Sea Breeze.",
                facts=[F("The user owns a yacht called Sea Breeze")],
            ),
            Turn("Haha, that was a joke, I don't own a yacht.", delete=["yacht"]),
        ],
        "What should I do this weekend?",
        absent=["yacht"],
        check=_status_of("yacht", "expired"),
    ),
    Scenario(
        "a constraint reaches the rules block",
        "constraints",
        [
            Turn(
                "Never schedule meetings before 10am for me.",
                facts=[F("Never schedule meetings for the user before 10am", "constraint")],
            )
        ],
        "Set up a call with the design team tomorrow.",
        expect=["[memrelay:constraints]", "before 10am"],
    ),
    Scenario(
        "a constraint replaced",
        "constraints",
        [
            Turn(
                "Always write my emails in formal English.",
                facts=[
                    F(
                        "Always write the user's emails in formal English",
                        "constraint",
                        ("user", "email_style", "formal"),
                    )
                ],
            ),
            Turn(
                "Change of plan: write my emails casually from now on.",
                facts=[
                    F(
                        "Write the user's emails casually",
                        "constraint",
                        ("user", "email_style", "casual"),
                        action="update",
                        refs=["formal"],
                    )
                ],
            ),
        ],
        "Draft an email to my landlord.",
        expect=["casually"],
        absent=["formal"],
    ),
    Scenario(
        "a move changes two facts at once",
        "one change, many facts",
        [
            Turn(
                "I live in Berlin.",
                facts=[F("The user lives in Berlin", slot=("user", "city", "Berlin"))],
            ),
            Turn(
                "I take the U-Bahn to work every day.",
                facts=[F("The user takes the U-Bahn to work", slot=("user", "commute", "U-Bahn"))],
            ),
            Turn(
                "We moved to Sydney and I drive to work now.",
                facts=[
                    F(
                        "The user lives in Sydney",
                        slot=("user", "city", "Sydney"),
                        action="update",
                        refs=["Berlin"],
                    ),
                    F(
                        "The user drives to work",
                        slot=("user", "commute", "car"),
                        action="update",
                        refs=["U-Bahn"],
                    ),
                ],
            ),
        ],
        "How long is my commute?",
        expect=["Sydney", "drives to work"],
        absent=["Berlin", "U-Bahn"],
    ),
    Scenario(
        "a pet's death",
        "negation",
        [
            Turn("I have a cat named Luna.", facts=[F("The user has a cat named Luna")]),
            Turn(
                "Luna passed away last week.",
                facts=[F("The user's cat Luna died recently", action="update", refs=["Luna"])],
            ),
        ],
        "Should I buy cat food?",
        expect=["died"],
        absent=["has a cat named Luna"],
    ),
    Scenario(
        "explicit remember, model silent",
        "explicit",
        [Turn("Please remember that I park on level 3.", model_silent=True)],
        "Where did I park?",
        expect=["level 3"],
        explicit=True,
    ),
    Scenario(
        "explicit remember in German, model silent",
        "explicit",
        [Turn("Merk dir, dass mein Hund Bello heißt.", model_silent=True)],
        "Wie heißt mein Hund?",
        expect=["Bello"],
        explicit=True,
    ),
    Scenario(
        "explicit remember in Spanish, model silent",
        "explicit",
        [Turn("Recuerda que soy alérgico a las fresas.", model_silent=True)],
        "¿Qué postre me recomiendas?",
        expect=["fresas"],
        explicit=True,
    ),
    Scenario(
        "explicit forget, model silent",
        "explicit",
        [
            Turn(
                "My bike lock code is 8080.",
                facts=[
                    F("The user's bike lock code is 8080", slot=("user", "bike_lock_code", "8080"))
                ],
            ),
            Turn("Forget my bike lock code.", model_silent=True),
        ],
        "What is my bike lock code?",
        absent=["8080"],
        check=_no_text_anywhere("8080"),
        explicit=True,
    ),
    Scenario(
        "explicit remember that repeats the model's fact",
        "explicit",
        [
            Turn(
                "Please note that I'm left-handed.",
                facts=[F("The user is left-handed", action="same", refs=["left-handed"])],
            ),
        ],
        "Which mouse should I buy?",
        expect=["left-handed"],
        check=_one_active("left-handed"),
        explicit=True,
    ),
    Scenario(
        "a diet back and forth",
        "corrections",
        [
            Turn("I'm vegan.", facts=[F("The user is vegan", slot=("user", "diet", "vegan"))]),
            Turn(
                "I started eating fish again, so pescatarian now.",
                facts=[
                    F(
                        "The user is pescatarian",
                        slot=("user", "diet", "pescatarian"),
                        action="update",
                        refs=["vegan"],
                    )
                ],
            ),
        ],
        "Plan a dinner menu for me.",
        expect=["pescatarian"],
        absent=["vegan"],
    ),
]


def by_user_text() -> dict[str, Turn]:
    """Every turn by its user text (unique across scenarios, checked here)."""
    turns: dict[str, Turn] = {}
    for scenario in SCENARIOS:
        for turn in scenario.turns:
            assert turn.user not in turns, f"user text used twice: {turn.user!r}"
            turns[turn.user] = turn
    return turns
