"""What both backends share: embedding off the event loop, the add path, and the
operations built from `list`, `recall` and a backend's `_import_batch`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import numpy as np

from memory_core import transfer
from memory_core.embedder import Embedder
from memory_core.errors import InvalidInput
from memory_core.model import Memory, NewMemory, validate_id
from memory_core.query_batcher import QueryBatcher
from memory_core.recall import DEFAULT_FUSION, Fusion, RecallQuery, clean_query, query_terms
from memory_core.store import ImportResult, ListQuery, Page

MAX_SPACES = 64
IMPORT_BATCH = 200


class EmbeddingStore:
    """Base of SQLiteStore and PostgresStore (the subclasses hold the SQL)."""

    embedder: Embedder

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        # How recall mixes the two sides: an embedder whose similarities spread unlike
        # MiniLM's carries its own (memory_core/recall.py, Fusion).
        self.fusion: Fusion = getattr(embedder, "fusion", DEFAULT_FUSION)
        # One embedding thread: recall queries batched and served before bulk work.
        self.batcher = QueryBatcher(embedder)
        self.schema_version = 0

    async def warm_up(self) -> None:
        """Load every model session now, not on a first request's time (the query
        session may first build its model copy: memory_core/query_model.py)."""
        await self.embed(["warm up"])
        await self.embed(["warm", "up"])
        # Beside the batcher, so that loading is not taken for a query's cost.
        queries = getattr(self.embedder, "embed_queries", None)
        if queries is not None:
            await asyncio.to_thread(queries, ["warm up"])

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Bulk embedding (adds, imports): runs when no recall query is waiting."""
        return await self.batcher.bulk(texts)

    async def embed_query(self, query: RecallQuery, text: str) -> np.ndarray:
        """A recall query's vector: batched with concurrent recalls, ahead of bulk work,
        from the embedder's query session; background recalls (reconciliation) and
        exact ones (forget-by-query) queue with the bulk work, embedded as memories are."""
        if query.background or query.exact_vector:
            return (await self.batcher.bulk([text]))[0]
        return await self.batcher.query(text, query.tenant)

    async def add(self, tenant: str, space: str, new: NewMemory, actor: str = "system") -> Memory:
        return (await self.add_many(tenant, space, [new], actor))[0]

    async def add_many(
        self, tenant: str, space: str, items: list[NewMemory], actor: str = "system"
    ) -> list[Memory]:
        checked = [item.validated() for item in items]
        vectors = await self.embed([item.content for item in checked])
        return await self.add_embedded(tenant, space, checked, vectors, actor)

    async def add_embedded(
        self,
        tenant: str,
        space: str,
        items: list[NewMemory],
        vectors: np.ndarray,
        actor: str = "system",
    ) -> list[Memory]:
        raise NotImplementedError

    def checked_embedded(
        self, tenant: str, space: str, items: list[NewMemory], vectors: np.ndarray
    ) -> list[NewMemory]:
        """Validated items for `add_embedded`, one vector of the right size each."""
        validate_id(tenant, "tenant")
        validate_id(space, "space")
        checked = [item.validated() for item in items]
        if len(vectors) != len(checked) or (len(checked) and vectors.shape[1] != self.embedder.dim):
            raise InvalidInput("one vector of the embedder's dimension is needed per memory")
        return checked

    async def list(self, query: ListQuery) -> Page:
        raise NotImplementedError

    async def recall(self, query: RecallQuery) -> list[Any]:
        raise NotImplementedError

    async def text_matches(
        self, tenant: str, spaces: list[str], words: list[str], after: int = 0, limit: int = 500
    ) -> tuple[list[Memory], int | None]:
        """Active, unexpired memories of `spaces` whose indexed text holds every one of
        `words` (by the index's own tokenizer and stemmer), in storage order after the
        cursor `after`, at most `limit`; with the next cursor, None after the last page.
        Every hit, not a ranking: what a forget request in words must reach."""
        raise NotImplementedError

    async def find_slot(
        self, tenant: str, space: str, subject: str, attribute: str
    ) -> list[Memory]:
        page = await self.list(
            ListQuery(tenant, [space], subject=subject, attribute=attribute, limit=20)
        )
        return [m for m in page.items if m.subject and m.attribute]

    async def nearest(
        self, tenant: str, space: str, text: str, k: int = 5
    ) -> list[tuple[Memory, float]]:
        """Active memories of one space nearest in meaning to `text`, with cosine similarity."""
        query = RecallQuery(tenant, [space], text, top_k=k, use_text=False, background=True)
        results = await self.recall(query)
        pairs = [(r.memory, r.breakdown.get("vector_similarity", 0.0)) for r in results]
        return sorted(pairs, key=lambda pair: pair[1], reverse=True)

    async def import_lines(self, tenant: str, lines: Iterable[str]) -> ImportResult:
        """Import JSONL from `export`; keeps ids and history; importing twice changes nothing."""
        validate_id(tenant, "tenant")
        result = ImportResult()
        batch: list[tuple[int, dict[str, Any]]] = []
        for number, line in enumerate(lines, start=1):
            record = transfer.parse_line(line, number, result)
            if record is not None:  # a long record becomes its parts
                batch += [(number, r) for r in transfer.split_long(record, number, result)]
            if len(batch) >= IMPORT_BATCH:
                await self._import_batch(tenant, batch, result)
                batch = []
        if batch:
            await self._import_batch(tenant, batch, result)
        return result

    async def _import_batch(
        self, tenant: str, batch: list[tuple[int, dict[str, Any]]], result: ImportResult
    ) -> None:
        raise NotImplementedError


def recall_input(query: RecallQuery) -> tuple[str, list[str]] | None:
    """The cleaned query text and its terms, or None when there is nothing to search."""
    validate_id(query.tenant, "tenant")
    if not query.spaces:
        return None
    if len(query.spaces) > MAX_SPACES:
        raise InvalidInput(f"at most {MAX_SPACES} read spaces")
    for space in query.spaces:
        validate_id(space, "space")
    text = clean_query(query.text)
    terms = query_terms(text) if query.use_text else []
    if not text or (not terms and not query.use_vector):
        return None
    return text, terms


def match_input(tenant: str, spaces: list[str], words: list[str]) -> list[str]:
    """Checked scope, and the words to match (folded, at most MAX_QUERY_TERMS); none
    means nothing to match."""
    validate_id(tenant, "tenant")
    if len(spaces) > MAX_SPACES:
        raise InvalidInput(f"at most {MAX_SPACES} read spaces")
    for space in spaces:
        validate_id(space, "space")
    return query_terms(clean_query(" ".join(words))) if spaces else []


def import_texts(batch: list[tuple[int, dict[str, Any]]]) -> list[str]:
    """Texts of the records that need an embedding (active, with content), in order."""
    return [r["content"] for _, r in batch if r.get("status") == "active" and r.get("content")]
