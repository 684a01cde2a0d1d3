"""A scripted "perfect model" for the scenario suite, answered by the fake upstream.

Extraction calls get the facts the scenario says (tests/scenarios.py), with ids
resolved against the memories memrelay showed in the call; judge calls answer
"unrelated" unless the texts are equal ignoring case; chat calls get the scenario's
assistant reply. Everything memrelay sent is recorded for the checks.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, date, datetime, timedelta
from typing import Any

from extraction.prompts import MARKER
from tests.fake_upstream import Recorded, Reply, completion
from tests.scenarios import F, Turn, by_user_text


def _refs(refs: list[str], shown: list[dict[str, Any]]) -> list[str]:
    ids = []
    for ref in refs:
        for memory in shown:
            if (
                ref.casefold() in (memory.get("memory") or "").casefold()
                and memory["id"] not in ids
            ):
                ids.append(memory["id"])
    return ids


def _expiry(f: F, today: str) -> str | None:
    if f.expires_in_s is not None:
        moment = datetime.now(UTC) + timedelta(seconds=f.expires_in_s)
        return moment.isoformat()
    if f.expires_date is not None:
        if f.expires_date.startswith("+"):
            return (
                date.fromisoformat(today[:10]) + timedelta(days=int(f.expires_date))
            ).isoformat()
        return f.expires_date
    return None


class PerfectModel:
    """Fake-upstream responder: `fake.responder = PerfectModel()`."""

    def __init__(self, chat_replies: bool = True, extraction: bool = True) -> None:
        self.turns: dict[str, Turn] = by_user_text()
        self.chat_replies = chat_replies
        self.extraction = extraction
        self.lock = threading.Lock()
        self.extraction_inputs: list[dict[str, Any]] = []
        self.chat_bodies: list[dict[str, Any]] = []

    def __call__(self, request: Recorded) -> Reply | None:
        if request.path != "/v1/chat/completions":
            return None
        body = request.json()
        if MARKER.encode() in request.body:
            if not self.extraction:
                return None
            return Reply.json(completion(json.dumps(self.answer(body))))
        with self.lock:
            self.chat_bodies.append(body)
        if not self.chat_replies:
            return None
        user = next(
            (m.get("content") for m in reversed(body["messages"]) if m.get("role") == "user"), ""
        )
        turn = self.turns.get(user) if isinstance(user, str) else None
        return Reply.json(completion(turn.reply if turn else "Happy to help."))

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        system = body["messages"][0]["content"]
        payload = json.loads(body["messages"][1]["content"])
        if "You compare" in system:
            new = payload["new_fact"].casefold()
            return {
                "verdicts": [
                    {
                        "id": m["id"],
                        "relation": "same" if m["memory"].casefold() == new else "unrelated",
                    }
                    for m in payload["existing_memories"]
                ]
            }
        if "asked to forget" in system:
            return {"memory_id": None}
        with self.lock:
            self.extraction_inputs.append(payload)
        turn = self.turns.get(payload.get("user", ""))
        empty = {"facts": [], "delete": [], "forget": []}
        if turn is None or turn.model_silent:
            return empty
        if turn.needs:
            context = payload.get("previous_assistant", "") + " ".join(
                t.get("text", "") for t in payload.get("earlier_turns") or []
            )
            if turn.needs not in context:
                return empty  # not given what it needs to understand the turn
        shown = payload.get("existing_memories") or []
        facts = []
        for f in turn.facts:
            subject, attribute, value = f.slot or (None, None, None)
            facts.append(
                {
                    "content": f.content,
                    "kind": f.kind,
                    "subject": subject,
                    "attribute": attribute,
                    "value": value,
                    "confidence": 0.9,
                    "stated_by": f.by,
                    "expires_at": _expiry(f, payload.get("current_date", "")),
                    "action": f.action,
                    "memory_ids": _refs(f.refs, shown),
                }
            )
        return {
            "facts": facts,
            "delete": _refs(turn.delete, shown),
            "forget": _refs(turn.forget, shown),
        }
