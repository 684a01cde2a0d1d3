"""The embedded memory store: one SQLite file with sqlite-vec and FTS5, async API."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from memory_core import lifecycle, transfer
from memory_core.embedder import Embedder
from memory_core.errors import InvalidInput
from memory_core.lint import Finding, lint
from memory_core.listing import MAX_LIMIT, list_sql, page_of
from memory_core.model import (
    STATUSES,
    Event,
    Memory,
    NewMemory,
    content_hash,
    validate_id,
)
from memory_core.recall import (
    Recalled,
    RecallQuery,
    knn,
    load_active,
    text_search,
)
from memory_core.rows import (
    EVENT_COLUMNS,
    MEMORY_COLUMNS,
    event_from_row,
    fetch_memory,
    memory_from_row,
)
from memory_core.sqlite import text_index
from memory_core.sqlite.db import Connection, check_database_path, connect
from memory_core.sqlite.hybrid_search import SearchRequest, hybrid_search
from memory_core.sqlite.schema import migrate
from memory_core.sqlite.search_process import SearchFailed, SearchProcess, SearchProcessDown
from memory_core.sqlite.standing import standing_candidates
from memory_core.sqlite.tenant_bm25 import TermHits
from memory_core.sqlite.text_match import matching_docs
from memory_core.sqlite.threads import ConnectionThreads, transaction
from memory_core.sqlite.vector_cache import VectorCache
from memory_core.sqlite.vector_snapshot import SnapshotDir
from memory_core.standing_rules import (
    Candidates,
    StandingPolicy,
    rule_room,
)
from memory_core.store import ImportResult, ListQuery, Page
from memory_core.store_base import EmbeddingStore, import_texts, match_input, recall_input

log = logging.getLogger("memrelay.memory")


class SQLiteStore(EmbeddingStore):
    """Serialised writes, pooled reads, embedding off the event loop."""

    def __init__(
        self,
        path: Path | str,
        embedder: Embedder,
        readers: int = 4,
        vector_cache: bool = True,
        search_process: bool = False,
    ) -> None:
        self.path = Path(path)
        # Vector snapshots beside the file: loaded by the cache, scrubbed by forget.
        self.snapshots = SnapshotDir(
            self.path.with_name(self.path.name + ".vectors"), embedder.name, embedder.dim
        )
        self._cache = VectorCache(embedder.dim, snapshots=self.snapshots) if vector_cache else None
        super().__init__(embedder)
        self._readers_count = readers
        self._writer: ConnectionThreads | None = None
        self._readers: ConnectionThreads | None = None
        self._term_hits = TermHits()  # common terms' postings, until the tenant's next write
        self._recalls = 0  # recalls in progress (counted on the event loop)
        # Recall's search in a child process, off this process's GIL (search_process.py).
        self._search = (
            SearchProcess(self.path, embedder.name, embedder.dim)
            if search_process and vector_cache
            else None
        )

    @classmethod
    async def open(cls, path: Path | str, embedder: Embedder, **options: Any) -> SQLiteStore:
        """Open (creating or migrating) the database; `options` as the constructor's
        (`vector_cache` keeps KNN in memory, `search_process` runs recall's search in a
        child process)."""
        store = cls(path, embedder, **options)
        await store.start()
        return store

    async def start(self) -> None:
        check_database_path(self.path)
        conn = await asyncio.to_thread(connect, self.path)
        try:
            self.schema_version = await asyncio.to_thread(
                migrate, conn, self.embedder.name, self.embedder.dim
            )
        finally:
            conn.close()
        self._writer = ConnectionThreads(self.path, 1, "memrelay-write")
        self._readers = ConnectionThreads(self.path, self._readers_count, "memrelay-read")
        await self.warm_up()
        if self._search is not None:
            await self._search.start()

    async def close(self) -> None:
        if self._search is not None:
            await self._search.close()
        if self._cache is not None and self._readers is not None:
            await self.run_read(self._cache.save)  # tenants changed since their snapshot
        for pool in (self._writer, self._readers):
            if pool is not None:
                await asyncio.to_thread(pool.close)
        self._writer = self._readers = None
        self.batcher.close()

    # -- plumbing -------------------------------------------------------------------

    async def run_write(self, fn: Any) -> Any:
        """Run `fn(conn)` in one transaction on the single writer thread."""
        if self._writer is None:
            raise RuntimeError("the store is not open")
        return await self._writer.run(lambda conn: transaction(conn, fn))

    async def run_read(self, fn: Any) -> Any:
        """Run `fn(conn)` on one of the reader threads."""
        if self._readers is None:
            raise RuntimeError("the store is not open")
        return await self._readers.run(fn)

    async def checkpoint(self) -> None:
        """Fold the WAL into the database file and truncate it."""
        if self._writer is None:
            raise RuntimeError("the store is not open")
        await self._writer.run(lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())

    # -- writes ---------------------------------------------------------------------

    async def add_embedded(
        self,
        tenant: str,
        space: str,
        items: list[NewMemory],
        vectors: np.ndarray,
        actor: str = "system",
    ) -> list[Memory]:
        """Add memories whose embeddings the caller already computed (bulk loads)."""
        checked = self.checked_embedded(tenant, space, items, vectors)

        def write(conn: Connection) -> list[Memory]:
            with text_index.tokenized_ahead(conn, [item.content for item in checked]):
                return [
                    lifecycle.insert_memory(conn, tenant, space, item, vectors[i], actor)
                    for i, item in enumerate(checked)
                ]

        return await self.run_write(write)

    async def supersede(
        self, tenant: str, old_id: str, new: NewMemory | str, reason: str, actor: str = "system"
    ) -> tuple[Memory, Memory]:
        """Replace `old_id` by a new memory (or by an existing active one, given its id)."""
        validate_id(tenant, "tenant")
        if isinstance(new, NewMemory):
            checked = new.validated()
            vector = (await self.embed([checked.content]))[0]
        else:
            checked, vector = None, None

        def write(conn: Connection) -> tuple[Memory, Memory]:
            _, old = lifecycle.require(conn, tenant, old_id)
            if checked is not None:
                replacement = lifecycle.insert_memory(
                    conn, tenant, old.space, checked, vector, actor
                )
            else:
                _, replacement = lifecycle.require(conn, tenant, str(new))
                if replacement.status != "active":
                    raise InvalidInput("the replacement memory must be active")
            superseded = lifecycle.mark_superseded(conn, tenant, old_id, replacement, reason, actor)
            return superseded, replacement

        return await self.run_write(write)

    async def reinforce(
        self,
        tenant: str,
        memory_id: str,
        provenance: dict[str, Any] | None = None,
        actor: str = "system",
    ) -> Memory:
        validate_id(tenant, "tenant")
        return await self.run_write(
            lambda conn: lifecycle.reinforce(conn, tenant, memory_id, provenance, actor)
        )

    async def retire(
        self, tenant: str, memory_id: str, reason: str, actor: str = "system"
    ) -> Memory:
        """An active memory no longer true, with no successor, becomes `expired`."""
        validate_id(tenant, "tenant")
        return await self.run_write(
            lambda conn: lifecycle.retire(conn, tenant, memory_id, reason, actor)
        )

    async def forget(
        self, tenant: str, memory_id: str, reason: str, actor: str = "system"
    ) -> Memory:
        validate_id(tenant, "tenant")

        def erase(conn: Connection) -> tuple[Memory, int]:
            memory = lifecycle.forget(conn, tenant, memory_id, reason, actor)
            return memory, lifecycle.require(conn, tenant, memory_id)[0]

        memory, rowid = await self.run_write(erase)
        await self.checkpoint()
        await asyncio.to_thread(self.snapshots.scrub, tenant, [rowid])  # and from the snapshot
        await self._sync_search(tenant)
        return memory

    async def _sync_search(self, tenant: str) -> None:
        """The search process drops a forgotten vector now, not at the tenant's next
        search (its copy in memory is the only one left after the scrub)."""
        if self._search is None or not self._search.usable():
            return
        try:
            await self._search.sync(tenant)
        except SearchProcessDown:
            pass  # a new child loads the tenant from the scrubbed files and database

    def search_status(self) -> dict[str, Any] | None:
        """The search process's state (None when recall searches in-process)."""
        return self._search.status() if self._search is not None else None

    async def expire_due(self, now: float | None = None) -> int:
        moment = time.time() if now is None else now
        expired = await self.run_write(lambda conn: lifecycle.expire_due(conn, moment, "expiry"))
        return len(expired)

    # -- reads ----------------------------------------------------------------------

    async def get(self, tenant: str, memory_id: str) -> Memory | None:
        validate_id(tenant, "tenant")
        found = await self.run_read(lambda conn: fetch_memory(conn, tenant, memory_id))
        return found[1] if found else None

    async def list(self, query: ListQuery) -> Page:
        sql, params, limit = list_sql(query, "?", "rowid")
        rows = await self.run_read(lambda conn: conn.execute(sql, params).fetchall())
        return Page(*page_of(rows, limit))

    async def find_duplicate(self, tenant: str, space: str, content: str) -> Memory | None:
        """The active memory of this space with the same text (by content hash), if any."""
        validate_id(tenant, "tenant")
        digest = content_hash(tenant, space, content)
        row = await self.run_read(
            lambda conn: conn.execute(
                f"SELECT {MEMORY_COLUMNS} FROM memories WHERE content_hash = ? AND tenant = ?"
                " AND space = ? AND status = 'active' LIMIT 1",
                (digest, tenant, space),
            ).fetchone()
        )
        return memory_from_row(row) if row else None

    async def history(self, tenant: str, memory_id: str) -> list[Event]:
        validate_id(tenant, "tenant")
        rows = await self.run_read(
            lambda conn: conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE tenant = ? AND memory_id = ?"
                " ORDER BY seq",
                (tenant, memory_id),
            ).fetchall()
        )
        return [event_from_row(row) for row in rows]

    async def events(self, tenant: str, since: int = 0, limit: int = 100) -> list[Event]:
        validate_id(tenant, "tenant")
        limit = max(1, min(limit, MAX_LIMIT))
        rows = await self.run_read(
            lambda conn: conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE tenant = ? AND seq > ?"
                " ORDER BY seq LIMIT ?",
                (tenant, since, limit),
            ).fetchall()
        )
        return [event_from_row(row) for row in rows]

    async def stats(self, tenant: str) -> dict[str, Any]:
        validate_id(tenant, "tenant")

        def count(conn: Connection) -> dict[str, Any]:
            out: dict[str, Any] = {"tenant": tenant, "total": 0}
            for column in ("status", "kind", "space"):
                rows = conn.execute(
                    f"SELECT {column}, count(*) FROM memories WHERE tenant = ? GROUP BY {column}",
                    (tenant,),
                ).fetchall()
                out[f"by_{column}"] = dict(rows)
            out["total"] = sum(out["by_status"].values())
            out["events"] = conn.execute(
                "SELECT count(*) FROM events WHERE tenant = ?", (tenant,)
            ).fetchone()[0]
            return out

        return await self.run_read(count)

    async def lint(self) -> list[Finding]:
        """Integrity findings (empty when the database is consistent)."""
        return await self.run_read(lint)

    async def status_counts(self) -> dict[str, int]:
        """Memories by status over all tenants (for metrics; no tenant data leaves)."""
        rows = await self.run_read(
            lambda conn: conn.execute(
                "SELECT status, count(*) FROM memories GROUP BY status"
            ).fetchall()
        )
        return {status: 0 for status in STATUSES} | dict(rows)

    async def recall(self, query: RecallQuery) -> list[Recalled]:
        """Hybrid recall over active memories of one tenant and its read spaces."""
        self._recalls += 1
        try:
            return await self._recall(query)
        finally:
            self._recalls -= 1

    async def _recall(self, query: RecallQuery) -> list[Recalled]:
        prepared = recall_input(query)
        if prepared is None:
            return []
        text, terms = prepared
        pool = max(query.top_k * 4, 40)
        now = time.time()
        readers = self._readers
        if readers is None:
            raise RuntimeError("the store is not open")
        remote = self._search if self._search is not None and self._search.usable() else None
        # Full-text search needs no vector: in-process, it runs on a reader thread while
        # the query is embedded (SQLite and ONNX release the GIL, so two cores work), and
        # the search takes its hits along. With the search process, it runs there, after the
        # embedding, unless this recall is alone (then the overlap saves its time and
        # there is no one to contend with). Every candidate passes the SQL guard, so the
        # two searches need not share a snapshot.
        alone = self._recalls == 1
        text_job = (
            readers.submit(lambda c: text_search(c, query, terms, pool, self._term_hits))
            if terms and (remote is None or alone)
            else None
        )
        try:
            vector = await self.embed_query(query, text) if query.use_vector else None
        except BaseException:
            if text_job is not None:
                text_job.cancel()
            raise

        policy = query.standing if vector is not None else None
        if policy is not None and not rule_room(query, policy):
            policy = None
        rules_k = policy.slots + query.top_k if policy is not None else 0
        request = SearchRequest(query, terms, pool, vector, policy, rules_k, now, self.fusion)
        if text_job is not None:  # found during the embedding: the search takes them along
            request = dataclasses.replace(request, text_hits=await asyncio.wrap_future(text_job))
        if remote is not None:
            try:
                return await remote.search(request)
            except SearchProcessDown:
                log.warning("search process went away; this recall searches in-process")
            except SearchFailed as exc:  # memory stays on: the readers try it too
                log.error("search failed in the search process (%s); searching in-process", exc)
        cache, term_hits = self._cache, self._term_hits
        return await self.run_read(lambda conn: hybrid_search(conn, cache, term_hits, request))

    async def text_matches(
        self, tenant: str, spaces: list[str], words: list[str], after: int = 0, limit: int = 500
    ) -> tuple[list[Memory], int | None]:
        """Every active memory of `spaces` holding all `words`, a page at a time
        (memory_core/sqlite/text_match.py); the cursor is a row id."""
        terms = match_input(tenant, spaces, words)
        if not terms:
            return [], None
        query = RecallQuery(tenant, list(spaces), " ".join(terms))

        def read(conn: Connection) -> tuple[list[Memory], int | None]:
            docs = matching_docs(conn, tenant, spaces, terms, after, limit)
            found = load_active(conn, query, docs, time.time())
            cursor = docs[-1] if len(docs) == limit else None
            return [found[doc] for doc in docs if doc in found], cursor

        return await self.run_read(read)

    async def standing_candidates(
        self,
        query: RecallQuery,
        vector: np.ndarray,
        k: int,
        policy: StandingPolicy | None = None,
    ) -> Candidates:
        """The `k` standing rules of the query's scope nearest `vector`, guarded."""
        now = time.time()
        return await self.run_read(
            lambda conn: standing_candidates(self._cache, conn, query, vector, k, now, policy)
        )

    def _knn(
        self, conn: Connection, query: RecallQuery, vector: np.ndarray, k: int
    ) -> list[tuple[int, float]]:
        if self._cache is None:
            return knn(conn, query, vector, k)
        return self._cache.search(conn, query.tenant, query.spaces, query.kinds, vector, k)

    # -- transfer -------------------------------------------------------------------

    async def export(self, tenant: str) -> AsyncIterator[str]:
        """JSONL, one memory per line with its events, in batches (constant memory)."""
        validate_id(tenant, "tenant")
        after = 0
        while True:
            batch, after = await self.run_read(
                lambda conn, a=after: transfer.export_batch(conn, tenant, a, 200)
            )
            if not batch:
                return
            for line in batch:
                yield line

    async def _import_batch(
        self, tenant: str, batch: list[tuple[int, dict[str, Any]]], result: ImportResult
    ) -> None:
        texts = import_texts(batch)
        vectors = await self.embed(texts)
        await self.run_write(
            lambda conn: transfer.import_records(conn, tenant, batch, vectors, result)
        )
