"""Facts as the extractor returns them, checked and normalised leniently."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import Any

from memory_core.model import KINDS, NewMemory, normalise_content

# What a fact does to the memories the extractor was shown: "add" (new), "update"
# (replaces the listed ids), "same" (already known as the listed id: reinforce).
ACTIONS = ("add", "update", "same")
MAX_EXPIRY_DAYS = 3_650

FACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "content": {"type": "string"},
                    "kind": {"type": "string", "enum": list(KINDS)},
                    "subject": {"type": ["string", "null"]},
                    "attribute": {"type": ["string", "null"]},
                    "value": {"type": ["string", "null"]},
                    "confidence": {"type": "number"},
                    "stated_by": {"type": "string", "enum": ["user", "assistant"]},
                    "expires_at": {"type": ["string", "null"]},
                    "action": {"type": "string", "enum": list(ACTIONS)},
                    "memory_ids": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["content", "kind", "confidence", "stated_by"],
            },
        },
        "delete": {"type": "array", "items": {"type": "string"}},
        "forget": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["facts"],
}


@dataclass
class Fact:
    content: str
    kind: str = "fact"
    subject: str | None = None
    attribute: str | None = None
    value: str | None = None
    confidence: float = 0.7
    stated_by: str = "user"
    entities: list[str] = field(default_factory=list)
    expires_at: float | None = None
    observed_at: float | None = None  # when it was said: the exchange's time
    action: str | None = None  # None: the model did not say; the judge decides
    memory_ids: list[str] = field(default_factory=list)  # short ids the model was shown

    def to_new_memory(self, provenance: dict[str, Any] | None) -> NewMemory:
        return NewMemory(
            content=self.content,
            kind=self.kind,
            subject=self.subject,
            attribute=self.attribute,
            value=self.value,
            confidence=self.confidence,
            source=self.stated_by,
            provenance=provenance,
            entities=list(self.entities),
            expires_at=self.expires_at,
            observed_at=self.observed_at,
        )


@dataclass
class Extraction:
    facts: list[Fact] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # shown ids no longer true
    forget: list[str] = field(default_factory=list)  # shown ids, or the user's words
    skipped: int = 0


def _text(value: Any, limit: int = 200) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    text = normalise_content(str(value))
    return text[:limit] or None


def read_expiry(value: Any, now: float | None = None) -> float | None:
    """`expires_at` as the model wrote it: a date (the end of that day, UTC), an ISO
    date-time, or epoch seconds. Unreadable, non-finite or absurdly far: no expiry."""
    if value is None or isinstance(value, bool):
        return None
    moment: float | None = None
    if isinstance(value, int | float):
        moment = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().replace("Z", "+00:00")
        try:
            if len(text) == 10:
                day = datetime.fromisoformat(text).date()
                moment = datetime.combine(day, time.max, UTC).timestamp()
            else:
                parsed = datetime.fromisoformat(text)
                if parsed.tzinfo is None:
                    parsed = parsed.replace(tzinfo=UTC)
                moment = parsed.timestamp()
        except ValueError:
            return None
    if moment is None or not math.isfinite(moment) or moment <= 0:
        return None
    reference = now if now is not None else datetime.now(UTC).timestamp()
    if moment > reference + timedelta(days=MAX_EXPIRY_DAYS).total_seconds():
        return None
    return moment


def _ids(values: Any) -> list[str]:
    """Short ids from a list of strings or of objects with `memory_id` / `id`."""
    out: list[str] = []
    for item in values if isinstance(values, list) else []:
        if isinstance(item, dict):
            item = item.get("memory_id") or item.get("id")
        if isinstance(item, str) and item.strip() and item.strip() not in out:
            out.append(item.strip()[:64])
    return out


def read_extraction(data: Any, now: float | None = None) -> Extraction:
    """Facts from model JSON; malformed items are skipped and counted, never fatal."""
    out = Extraction()
    if isinstance(data, list):
        data = {"facts": data}
    if not isinstance(data, dict):
        raise ValueError(f"extraction output must be an object, got {type(data).__name__}")
    for item in data.get("facts") or []:
        if not isinstance(item, dict) or not _text(item.get("content"), 2000):
            out.skipped += 1
            continue
        kind = item.get("kind") if item.get("kind") in KINDS else "fact"
        try:
            confidence = min(1.0, max(0.0, float(item.get("confidence", 0.7))))
        except (TypeError, ValueError):
            confidence = 0.7
        stated_by = "assistant" if item.get("stated_by") == "assistant" else "user"
        out.facts.append(
            Fact(
                content=_text(item["content"], 2000) or "",
                kind=kind,
                subject=_text(item.get("subject"), 128),
                attribute=_text(item.get("attribute"), 128),
                value=_text(item.get("value"), 500),
                confidence=confidence,
                stated_by=stated_by,
                expires_at=read_expiry(item.get("expires_at"), now),
                action=str(item["action"]).lower()
                if str(item.get("action", "")).lower() in ACTIONS
                else None,
                memory_ids=_ids(item.get("memory_ids")),
            )
        )
    out.delete = _ids(data.get("delete"))
    for request in data.get("forget") or []:
        if isinstance(request, dict):
            request = request.get("memory_id") or request.get("id")
        if text := _text(request, 500):
            out.forget.append(text)
    return out
