"""What the extraction model is asked, in words and JSON shapes.

Three calls, each marked with MARKER so a proxy in front of the model can tell them
from a user's chat:
- extract: the last exchange, with its context (the assistant turn the user answered,
  a few earlier turns, today's date) and the existing memories related to it, each
  under a short id (m1, m2, ...). The model proposes facts that add to, update, or
  repeat ("same") those memories, ids that are no longer true, and ids to forget.
- judge ("You compare"): one new fact against every close existing memory, when the
  extractor did not say how they relate.
- choose ("asked to forget"): which memory a forget request in the user's words means.
The model only proposes; `extraction/reconcile.py` decides what is applied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from extraction.facts import FACT_SCHEMA

MARKER = "memrelay-extraction"

EXTRACT_SYSTEM = f"""You extract durable memories from the latest exchange between a user and an assistant ({MARKER}).
The input is JSON with:
- "current_date": today, to resolve "tomorrow", "until Friday", "next week";
- "earlier_turns" and "previous_assistant": the conversation before the latest user message, for context only (facts from them were extracted before);
- "user": the latest user message; "assistant": the reply to it;
- "existing_memories": what is already remembered that may be related, each with a short "id".
Return JSON: {{"facts": [...], "delete": [...], "forget": [...]}}.
Each fact is an object with:
- "content": one self-contained sentence naming who it is about ("The user prefers casual emails", never "it is casual");
- "kind": "fact", "preference", "constraint" (a rule the assistant must follow), "error" (something that went wrong), "goal" or "note";
- "subject" and "attribute": a short slot such as "user" and "email_tone" when the fact sets a value that could later change, else null;
- "value": that value ("casual"), else null;
- "confidence": 0 to 1;
- "stated_by": "user" if the user said or confirmed it (a "yes" to the assistant's question counts), "assistant" if only the assistant claimed it;
- "expires_at": "YYYY-MM-DD" (the last day it holds) when the fact is temporary ("on vacation until Friday"), else null;
- "action": "add" if it is new, "update" if it replaces existing memories (they are no longer true), "same" if an existing memory already says it (in other words too);
- "memory_ids": the ids it updates, or the one id it repeats; [] for "add".
One fact may update several memories ("I quit nursing for software" updates the job and "works night shifts"; "I don't eat meat any more" updates "loves steak").
"delete" lists ids of existing memories the user says are no longer true or were never true (a retracted joke) when no new fact replaces them.
"forget" lists ids of existing memories the user explicitly asks to be forgotten (or, if none is shown, the user's words).
Only keep what will still matter in later conversations. Small talk gives empty lists.
Answer with the JSON only."""

CLASSIFY_SYSTEM = f"""You compare existing memories with a new fact about the same person or thing ({MARKER}).
The input is JSON with "new_fact" and "existing_memories" (each with an "id").
Answer JSON {{"verdicts": [{{"id": ID, "relation": R}}, ...]}}, one per existing memory, where R is one of:
"same" (says the same thing, perhaps in other words), "contradicts" (both cannot be true now),
"updates" (the new fact replaces the old one), "extends" (adds detail, both stay true), "unrelated"."""

RELATIONS = ("same", "contradicts", "updates", "extends", "unrelated")

CLASSIFY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdicts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "relation": {"type": "string", "enum": list(RELATIONS)},
                },
                "required": ["id", "relation"],
            },
        }
    },
    "required": ["verdicts"],
}

CHOOSE_SYSTEM = f"""The user asked to forget something ({MARKER}). You get the request and candidate memories with ids.
Answer JSON {{"memory_id": ID}} with the id of the one memory the user clearly means,
or {{"memory_id": null}} if none matches or more than one could be meant."""

CHOOSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"memory_id": {"type": ["string", "null"]}},
    "required": ["memory_id"],
}


@dataclass
class ExchangeInput:
    """Everything the extractor is shown about one exchange."""

    user: str
    assistant: str = ""
    previous_assistant: str = ""
    earlier_turns: list[dict[str, str]] = field(default_factory=list)
    at: float | None = None  # when the exchange happened (epoch seconds)


def current_date(at: float | None) -> str:
    """`2026-11-30 (Monday)`, in UTC."""
    moment = datetime.fromtimestamp(at, UTC) if at else datetime.now(UTC)
    return moment.strftime("%Y-%m-%d (%A)")


def memory_listing(shown: dict[str, Any]) -> list[dict[str, Any]]:
    """Shown memories as the model reads them: short id, text, kind, who said it, slot."""
    listing = []
    for short_id, memory in shown.items():
        entry: dict[str, Any] = {
            "id": short_id,
            "memory": memory.content,
            "kind": memory.kind,
            "stated_by": memory.source,
        }
        if memory.subject and memory.attribute:
            entry["slot"] = f"{memory.subject}.{memory.attribute}"
        listing.append(entry)
    return listing


def extract_messages(
    exchange: ExchangeInput | str, assistant: str = "", shown: dict[str, Any] | None = None
) -> list[dict[str, str]]:
    if isinstance(exchange, str):
        exchange = ExchangeInput(exchange, assistant)
    payload: dict[str, Any] = {
        "current_date": current_date(exchange.at),
        "earlier_turns": exchange.earlier_turns,
        "previous_assistant": exchange.previous_assistant,
        "user": exchange.user,
        "assistant": exchange.assistant,
        "existing_memories": memory_listing(shown or {}),
    }
    text = json.dumps(payload, ensure_ascii=False)
    return [{"role": "system", "content": EXTRACT_SYSTEM}, {"role": "user", "content": text}]


def classify_messages(candidates: dict[str, str], new: str) -> list[dict[str, str]]:
    """The judge's input: short id -> existing memory text, and the new fact."""
    listing = [{"id": short_id, "memory": text} for short_id, text in candidates.items()]
    payload: dict[str, Any] = {"new_fact": new, "existing_memories": listing}
    if len(listing) == 1:  # the single-pair shape of earlier versions, for old scripts
        payload["existing_memory"] = listing[0]["memory"]
    pair = json.dumps(payload, ensure_ascii=False)
    return [{"role": "system", "content": CLASSIFY_SYSTEM}, {"role": "user", "content": pair}]


def choose_messages(request: str, candidates: list[tuple[str, str]]) -> list[dict[str, str]]:
    listing = [{"id": memory_id, "memory": content} for memory_id, content in candidates]
    payload = json.dumps({"request": request, "candidates": listing}, ensure_ascii=False)
    return [{"role": "system", "content": CHOOSE_SYSTEM}, {"role": "user", "content": payload}]


__all__ = [
    "FACT_SCHEMA",
    "MARKER",
    "ExchangeInput",
    "choose_messages",
    "classify_messages",
    "extract_messages",
]
