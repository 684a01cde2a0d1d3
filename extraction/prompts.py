"""What the extraction model is asked, in words and JSON shapes."""

from __future__ import annotations

import json
from typing import Any

from extraction.facts import FACT_SCHEMA

MARKER = "memrelay-extraction"

EXTRACT_SYSTEM = f"""You extract durable memories from one exchange between a user and an assistant ({MARKER}).
Return JSON: {{"facts": [...], "forget": [...]}}.
Each fact is an object with:
- "content": one self-contained sentence naming who it is about ("The user prefers casual emails", never "it is casual");
- "kind": "fact", "preference", "constraint" (a rule the assistant must follow), "error" (something that went wrong), "goal" or "note";
- "subject" and "attribute": a short slot such as "user" and "email_tone" when the fact sets a value that could later change, else null;
- "value": that value ("casual"), else null;
- "confidence": 0 to 1;
- "stated_by": "user" if the user said it, "assistant" if only the assistant claimed it.
Only keep what will still matter in later conversations. Small talk gives an empty list.
"forget" lists, in the user's words, things the user explicitly asked to be forgotten; else [].
Answer with the JSON only."""

CLASSIFY_SYSTEM = f"""You compare an existing memory with a new fact about the same person or thing ({MARKER}).
Answer JSON {{"relation": R}} where R is one of:
"contradicts" (both cannot be true now), "updates" (the new fact replaces the old one),
"extends" (adds detail, both stay true), "unrelated"."""

CLASSIFY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "relation": {"type": "string", "enum": ["contradicts", "updates", "extends", "unrelated"]}
    },
    "required": ["relation"],
}

CHOOSE_SYSTEM = f"""The user asked to forget something ({MARKER}). You get the request and candidate memories with ids.
Answer JSON {{"memory_id": ID}} with the id of the one memory the user clearly means,
or {{"memory_id": null}} if none matches or more than one could be meant."""

CHOOSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"memory_id": {"type": ["string", "null"]}},
    "required": ["memory_id"],
}


def extract_messages(user: str, assistant: str) -> list[dict[str, str]]:
    exchange = json.dumps({"user": user, "assistant": assistant}, ensure_ascii=False)
    return [{"role": "system", "content": EXTRACT_SYSTEM}, {"role": "user", "content": exchange}]


def classify_messages(old: str, new: str) -> list[dict[str, str]]:
    pair = json.dumps({"existing_memory": old, "new_fact": new}, ensure_ascii=False)
    return [{"role": "system", "content": CLASSIFY_SYSTEM}, {"role": "user", "content": pair}]


def choose_messages(request: str, candidates: list[tuple[str, str]]) -> list[dict[str, str]]:
    listing = [{"id": memory_id, "memory": content} for memory_id, content in candidates]
    payload = json.dumps({"request": request, "candidates": listing}, ensure_ascii=False)
    return [{"role": "system", "content": CHOOSE_SYSTEM}, {"role": "user", "content": payload}]


__all__ = ["FACT_SCHEMA", "MARKER", "choose_messages", "classify_messages", "extract_messages"]
