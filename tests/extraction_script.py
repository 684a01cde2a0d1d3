"""A scripted extraction model, answered by the fake upstream for extraction calls."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from typing import Any

from extraction.prompts import MARKER
from tests.fake_upstream import Recorded, Reply, completion


def fact(
    content: str,
    kind: str = "fact",
    subject: str | None = None,
    attribute: str | None = None,
    value: str | None = None,
    stated_by: str = "user",
    confidence: float = 0.9,
) -> dict[str, Any]:
    return {
        "content": content,
        "kind": kind,
        "subject": subject,
        "attribute": attribute,
        "value": value,
        "confidence": confidence,
        "stated_by": stated_by,
    }


class ScriptedExtraction:
    """Maps a user message (by substring) to the facts the 'model' extracts from it."""

    def __init__(self) -> None:
        self.facts: dict[str, list[dict[str, Any]]] = {}
        self.forget: dict[str, list[str]] = {}
        self.relation = "unrelated"
        self.choose: Callable[[list[dict[str, str]]], str | None] = lambda c: None
        self.failure_rate = 0.0
        self.rng = random.Random(99)
        self.lock = threading.Lock()
        self.calls: list[dict[str, Any]] = []

    def __call__(self, request: Recorded) -> Reply | None:
        if request.path != "/v1/chat/completions" or MARKER.encode() not in request.body:
            return None
        body = request.json()
        with self.lock:
            self.calls.append(body)
            roll = self.rng.random()
        if roll < self.failure_rate / 2:
            return Reply.json({"error": {"message": "scripted outage"}}, status=503)
        if roll < self.failure_rate:
            return Reply.json(completion("I am not JSON at all, sorry."))
        system = body["messages"][0]["content"]
        payload = json.loads(body["messages"][1]["content"])
        if "You compare" in system:
            answer: Any = {
                "verdicts": [
                    {"id": c["id"], "relation": self.relation} for c in payload["existing_memories"]
                ]
            }
        elif "asked to forget" in system:
            answer = {"memory_id": self.choose(payload["candidates"])}
        else:
            user = payload["user"]
            facts = [f for key, fs in self.facts.items() if key in user for f in fs]
            forget = [r for key, rs in self.forget.items() if key in user for r in rs]
            answer = {"facts": facts, "forget": forget}
        return Reply.json(completion("```json\n" + json.dumps(answer) + "\n```"))
