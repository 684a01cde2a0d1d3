"""What a memory is: kinds, statuses, the allowed transitions, and derived severity."""

from __future__ import annotations

import hashlib
import math
import re
import time
import unicodedata
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from memory_core.errors import InvalidInput, InvalidTransition

Kind = Literal["fact", "preference", "constraint", "error", "goal", "note"]
Status = Literal["active", "superseded", "forgotten", "expired"]
Source = Literal["user", "assistant", "admin", "import"]
Severity = Literal["critical", "antipattern", "context"]

KINDS: tuple[str, ...] = get_args(Kind)
STATUSES: tuple[str, ...] = get_args(Status)
SOURCES: tuple[str, ...] = get_args(Source)

# The only lifecycle moves; everything else raises InvalidTransition.
TRANSITIONS: frozenset[tuple[str, str]] = frozenset(
    {
        ("active", "superseded"),
        ("active", "forgotten"),
        ("active", "expired"),
        ("superseded", "forgotten"),
        ("expired", "forgotten"),
    }
)

MAX_CONTENT_CHARS = 8_000
_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_SLOT_RE = re.compile(r"[^a-z0-9]+")


def check_transition(current: str, new: str) -> None:
    if (current, new) not in TRANSITIONS:
        raise InvalidTransition(f"a memory cannot go from {current!r} to {new!r}")


def severity_of(kind: str) -> Severity:
    """Derived from the kind alone, never guessed from tone."""
    if kind == "constraint":
        return "critical"
    if kind == "error":
        return "antipattern"
    return "context"


def validate_id(value: object, what: str) -> str:
    """A tenant or space id: 1 to 128 characters of [A-Za-z0-9._:-]."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise InvalidInput(
            f"{what} id must be 1 to 128 characters of A-Z a-z 0-9 . _ : - (got {value!r})"
        )
    return value


def normalise_slot(value: str | None) -> str | None:
    """`Email Tone` -> `email_tone`: slots compare equal however they were written."""
    if value is None:
        return None
    text = unicodedata.normalize("NFKC", value).strip().lower()
    text = _SLOT_RE.sub("_", text).strip("_")
    return text[:128] or None


def normalise_content(content: str) -> str:
    return " ".join(unicodedata.normalize("NFC", content).split())


def content_hash(tenant: str, space: str, content: str) -> str:
    """Same text in the same tenant and space hashes equal, whatever its case or spacing."""
    key = f"{tenant}\x00{space}\x00{normalise_content(content).casefold()}"
    return hashlib.sha256(key.encode()).hexdigest()


def new_memory_id() -> str:
    """Time-ordered and unique: `mem_` + 12 hex of milliseconds + 16 random hex."""
    return f"mem_{int(time.time() * 1000):012x}{uuid.uuid4().hex[:16]}"


@dataclass
class NewMemory:
    """What a caller supplies to remember something."""

    content: str
    kind: str = "fact"
    subject: str | None = None
    attribute: str | None = None
    value: str | None = None
    confidence: float = 0.8
    source: str = "user"
    provenance: dict[str, Any] | None = None
    expires_at: float | None = None
    entities: list[str] = field(default_factory=list)
    observed_at: float | None = None  # when the thing was said (unix time), if known

    def validated(self) -> NewMemory:
        if not isinstance(self.content, str) or not normalise_content(self.content):
            raise InvalidInput("content must be a non-empty sentence")
        if len(self.content) > MAX_CONTENT_CHARS:
            raise InvalidInput(f"content is longer than {MAX_CONTENT_CHARS} characters")
        if self.kind not in KINDS:
            raise InvalidInput(f"kind must be one of {', '.join(KINDS)} (got {self.kind!r})")
        if self.source not in SOURCES:
            raise InvalidInput(f"source must be one of {', '.join(SOURCES)} (got {self.source!r})")
        if self.expires_at is not None and not math.isfinite(self.expires_at):
            raise InvalidInput(f"expires_at must be a finite time (got {self.expires_at!r})")
        if self.observed_at is not None and (
            isinstance(self.observed_at, bool)
            or not isinstance(self.observed_at, int | float)
            or not math.isfinite(self.observed_at)
            or self.observed_at < 0
        ):
            raise InvalidInput(f"observed_at must be a finite time >= 0 (got {self.observed_at!r})")
        if not isinstance(self.confidence, int | float) or not 0 <= self.confidence <= 1:
            raise InvalidInput(f"confidence must be between 0 and 1 (got {self.confidence!r})")
        return NewMemory(
            content=normalise_content(self.content),
            kind=self.kind,
            subject=normalise_slot(self.subject),
            attribute=normalise_slot(self.attribute),
            value=self.value.strip() if isinstance(self.value, str) else self.value,
            confidence=float(self.confidence),
            source=self.source,
            provenance=self.provenance,
            expires_at=self.expires_at,
            entities=sorted({e.strip() for e in self.entities if e and e.strip()}),
            observed_at=float(self.observed_at) if self.observed_at is not None else None,
        )


@dataclass
class Memory:
    """A stored memory. Forgotten ones keep only id, scope, status, timestamps and reason."""

    id: str
    tenant: str
    space: str
    kind: str
    content: str | None
    subject: str | None
    attribute: str | None
    value: str | None
    confidence: float
    source: str
    provenance: list[dict[str, Any]]
    status: str
    superseded_by: str | None
    status_reason: str | None
    created_at: float
    updated_at: float
    expires_at: float | None
    content_hash: str | None
    entities: list[str]
    observed_at: float | None = None  # when the thing was said; None: unknown

    @property
    def severity(self) -> Severity:
        return severity_of(self.kind)

    def as_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["severity"] = self.severity
        return data


@dataclass
class Event:
    """One state change; never carries memory content."""

    seq: int
    event_id: str
    memory_id: str
    tenant: str
    space: str
    action: str
    actor: str
    reason: str | None
    at: float
    detail: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}
