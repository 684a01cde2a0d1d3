"""The store protocol: what the proxy and extraction may ask of any memory backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from memory_core.model import Event, Memory, NewMemory
from memory_core.recall import Recalled, RecallQuery


@dataclass
class ListQuery:
    tenant: str
    spaces: list[str] | None = None
    statuses: list[str] | None = field(default_factory=lambda: ["active"])
    kinds: list[str] | None = None
    subject: str | None = None
    attribute: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    limit: int = 50
    cursor: str | None = None


@dataclass
class Page:
    items: list[Memory]
    next_cursor: str | None


@dataclass
class ImportResult:
    imported: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)


class MemoryStore(Protocol):
    async def start(self) -> None:
        """Open (creating or migrating the schema)."""

    async def add(
        self, tenant: str, space: str, new: NewMemory, actor: str = "system"
    ) -> Memory: ...

    async def add_many(
        self, tenant: str, space: str, items: list[NewMemory], actor: str = "system"
    ) -> list[Memory]: ...

    async def get(self, tenant: str, memory_id: str) -> Memory | None: ...

    async def list(self, query: ListQuery) -> Page: ...

    async def supersede(
        self, tenant: str, old_id: str, new: NewMemory | str, reason: str, actor: str = "system"
    ) -> tuple[Memory, Memory]: ...

    async def reinforce(
        self,
        tenant: str,
        memory_id: str,
        provenance: dict[str, Any] | None = None,
        actor: str = "system",
    ) -> Memory: ...

    async def forget(
        self, tenant: str, memory_id: str, reason: str, actor: str = "system"
    ) -> Memory: ...

    async def retire(
        self, tenant: str, memory_id: str, reason: str, actor: str = "system"
    ) -> Memory:
        """Active to `expired` now: no longer true, and nothing replaces it."""
        ...

    async def expire_due(self, now: float | None = None) -> int: ...

    async def find_duplicate(self, tenant: str, space: str, content: str) -> Memory | None: ...

    async def history(self, tenant: str, memory_id: str) -> list[Event]: ...

    async def events(self, tenant: str, since: int = 0, limit: int = 100) -> list[Event]: ...

    async def stats(self, tenant: str) -> dict[str, Any]: ...

    async def status_counts(self) -> dict[str, int]: ...

    async def recall(self, query: RecallQuery) -> list[Recalled]: ...

    async def text_matches(
        self, tenant: str, spaces: list[str], words: list[str], after: int = 0, limit: int = 500
    ) -> tuple[list[Memory], int | None]:
        """Every active memory of `spaces` holding all `words` by the full-text index, a
        page at a time after the cursor `after`; the next cursor, or None at the end."""
        ...

    async def nearest(
        self, tenant: str, space: str, text: str, k: int = 5
    ) -> list[tuple[Memory, float]]: ...

    async def find_slot(
        self, tenant: str, space: str, subject: str, attribute: str
    ) -> list[Memory]: ...

    def export(self, tenant: str) -> AsyncIterator[str]: ...

    async def import_lines(self, tenant: str, lines: Iterable[str]) -> ImportResult: ...

    async def lint(self) -> list[Any]: ...

    async def close(self) -> None: ...
