"""Facts as the extractor returns them, checked and normalised leniently."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memory_core.model import KINDS, NewMemory, normalise_content

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
                },
                "required": ["content", "kind", "confidence", "stated_by"],
            },
        },
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
        )


@dataclass
class Extraction:
    facts: list[Fact] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)
    skipped: int = 0


def _text(value: Any, limit: int = 200) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    text = normalise_content(str(value))
    return text[:limit] or None


def read_extraction(data: Any) -> Extraction:
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
            )
        )
    for request in data.get("forget") or []:
        if text := _text(request, 500):
            out.forget.append(text)
    return out
