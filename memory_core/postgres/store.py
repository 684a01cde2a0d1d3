"""The shared memory store: Postgres with pgvector, for several memrelay replicas.

Same protocol, same lifecycle and the same fused recall as the SQLite store. Recall is
one SQL statement: HNSW KNN and full-text candidates as CTEs, then the guard (tenant,
read spaces, active, unexpired) on the rows they name, so nothing inactive or out of
scope can come back even if an index were stale.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from memory_core import transfer
from memory_core.embedder import Embedder
from memory_core.errors import InvalidInput
from memory_core.lint import COMMON_CHECKS, POSTGRES_CHECKS, Finding
from memory_core.listing import MAX_LIMIT, list_sql, page_of
from memory_core.model import STATUSES, Event, Memory, NewMemory, content_hash, validate_id
from memory_core.postgres import lifecycle as pg_lifecycle
from memory_core.postgres.schema import migrate
from memory_core.postgres.standing import standing_candidates
from memory_core.postgres.text_stats import ScopeStats, bm25_ctes, bm25_params
from memory_core.recall import (
    COMMON_TTL_S,
    POSTINGS_BUDGET,
    Recalled,
    RecallQuery,
    fuse,
)
from memory_core.rows import (
    EVENT_COLUMNS,
    MEMORY_COLUMNS,
    MEMORY_FIELDS,
    event_from_row,
    memory_from_row,
)
from memory_core.standing_rules import Candidates, StandingPolicy, with_standing_rules
from memory_core.store import ImportResult, ListQuery, Page
from memory_core.store_base import EmbeddingStore, import_texts, match_input, recall_input

TEXT_KEY = "text_bm25"  # BM25 with the tenant's own statistics, as on SQLite (text_stats.py)


async def _configure(conn: AsyncConnection) -> None:
    """Per connection: the vector type, and HNSW scans that keep going past filtered rows."""
    await register_vector_async(conn)
    await conn.execute("SET hnsw.iterative_scan = relaxed_order")
    await conn.execute("SET hnsw.ef_search = 100")
    await conn.commit()


class PostgresStore(EmbeddingStore):
    """`MemoryStore` over a psycopg async pool; embedding runs off the event loop."""

    def __init__(
        self, url: str, embedder: Embedder, min_connections: int = 1, max_connections: int = 10
    ) -> None:
        self.url = url
        super().__init__(embedder)
        self._pool = AsyncConnectionPool(
            url,
            min_size=min_connections,
            max_size=max_connections,
            configure=_configure,
            open=False,
            kwargs={"application_name": "memrelay"},
        )
        self._common: list[str] = []  # lexemes too common to rank, from pg_stats
        self._common_until = 0.0
        self._scope_stats = ScopeStats()

    @classmethod
    async def open(cls, url: str, embedder: Embedder, **options: Any) -> PostgresStore:
        store = cls(url, embedder, **options)
        await store.start()
        return store

    async def start(self) -> None:
        async with await AsyncConnection.connect(self.url) as conn:
            self.schema_version = await migrate(conn, self.embedder.name, self.embedder.dim)
        await self._pool.open(wait=True)
        await self.warm_up()

    async def close(self) -> None:
        await self._pool.close()
        self.batcher.close()

    # -- plumbing -------------------------------------------------------------------

    def connection(self) -> Any:
        """A pooled connection (async context manager); commits when the block ends."""
        return self._pool.connection()

    async def fetch(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        async with self._pool.connection() as conn:
            return await (await conn.execute(sql, params)).fetchall()

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
        async with self._pool.connection() as conn:
            return [
                await pg_lifecycle.insert_memory(conn, tenant, space, item, vectors[i], actor)
                for i, item in enumerate(checked)
            ]

    async def supersede(
        self, tenant: str, old_id: str, new: NewMemory | str, reason: str, actor: str = "system"
    ) -> tuple[Memory, Memory]:
        validate_id(tenant, "tenant")
        checked = new.validated() if isinstance(new, NewMemory) else None
        vector = (await self.embed([checked.content]))[0] if checked is not None else None
        async with self._pool.connection() as conn:
            old = await pg_lifecycle.require(conn, tenant, old_id)
            if checked is not None:
                replacement = await pg_lifecycle.insert_memory(
                    conn, tenant, old.space, checked, vector, actor
                )
            else:
                replacement = await pg_lifecycle.require(conn, tenant, str(new))
                if replacement.status != "active":
                    raise InvalidInput("the replacement memory must be active")
            superseded = await pg_lifecycle.mark_superseded(
                conn, tenant, old_id, replacement, reason, actor
            )
            return superseded, replacement

    async def reinforce(
        self,
        tenant: str,
        memory_id: str,
        provenance: dict[str, Any] | None = None,
        actor: str = "system",
    ) -> Memory:
        validate_id(tenant, "tenant")
        async with self._pool.connection() as conn:
            return await pg_lifecycle.reinforce(conn, tenant, memory_id, provenance, actor)

    async def retire(
        self, tenant: str, memory_id: str, reason: str, actor: str = "system"
    ) -> Memory:
        """An active memory no longer true, with no successor, becomes `expired`."""
        validate_id(tenant, "tenant")
        async with self._pool.connection() as conn:
            return await pg_lifecycle.retire(conn, tenant, memory_id, reason, actor)

    async def forget(
        self, tenant: str, memory_id: str, reason: str, actor: str = "system"
    ) -> Memory:
        validate_id(tenant, "tenant")
        async with self._pool.connection() as conn:
            return await pg_lifecycle.forget(conn, tenant, memory_id, reason, actor)

    async def expire_due(self, now: float | None = None) -> int:
        moment = time.time() if now is None else now
        async with self._pool.connection() as conn:
            return len(await pg_lifecycle.expire_due(conn, moment, "expiry"))

    # -- reads ----------------------------------------------------------------------

    async def get(self, tenant: str, memory_id: str) -> Memory | None:
        validate_id(tenant, "tenant")
        async with self._pool.connection() as conn:
            return await pg_lifecycle.fetch(conn, tenant, memory_id)

    async def list(self, query: ListQuery) -> Page:
        sql, params, limit = list_sql(query, "%s", "seq")
        return Page(*page_of(await self.fetch(sql, params), limit))

    async def find_duplicate(self, tenant: str, space: str, content: str) -> Memory | None:
        validate_id(tenant, "tenant")
        rows = await self.fetch(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE content_hash = %s AND tenant = %s"
            " AND space = %s AND status = 'active' LIMIT 1",
            (content_hash(tenant, space, content), tenant, space),
        )
        return memory_from_row(rows[0]) if rows else None

    async def history(self, tenant: str, memory_id: str) -> list[Event]:
        validate_id(tenant, "tenant")
        rows = await self.fetch(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE tenant = %s AND memory_id = %s ORDER BY seq",
            (tenant, memory_id),
        )
        return [event_from_row(row) for row in rows]

    async def events(self, tenant: str, since: int = 0, limit: int = 100) -> list[Event]:
        validate_id(tenant, "tenant")
        rows = await self.fetch(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE tenant = %s AND seq > %s"
            " ORDER BY seq LIMIT %s",
            (tenant, since, max(1, min(limit, MAX_LIMIT))),
        )
        return [event_from_row(row) for row in rows]

    async def stats(self, tenant: str) -> dict[str, Any]:
        validate_id(tenant, "tenant")
        out: dict[str, Any] = {"tenant": tenant}
        for column in ("status", "kind", "space"):
            rows = await self.fetch(
                f"SELECT {column}, count(*) FROM memories WHERE tenant = %s GROUP BY {column}",
                (tenant,),
            )
            out[f"by_{column}"] = dict(rows)
        out["total"] = sum(out["by_status"].values())
        rows = await self.fetch("SELECT count(*) FROM events WHERE tenant = %s", (tenant,))
        out["events"] = rows[0][0]
        return out

    async def status_counts(self) -> dict[str, int]:
        rows = await self.fetch("SELECT status, count(*) FROM memories GROUP BY status")
        return {status: 0 for status in STATUSES} | dict(rows)

    async def lint(self, limit: int = 1000) -> list[Finding]:
        findings: list[Finding] = []
        for name, sql, detail in POSTGRES_CHECKS + COMMON_CHECKS:
            for (memory_id,) in await self.fetch(sql + f" LIMIT {int(limit)}"):
                findings.append(Finding(name, memory_id, detail))
        return findings

    async def recall(self, query: RecallQuery) -> list[Recalled]:
        """Hybrid recall over active memories of one tenant and its read spaces."""
        prepared = recall_input(query)
        if prepared is None:
            return []
        text, terms = prepared
        vector = await self.embed_query(query, text) if query.use_vector else None
        now = time.time()
        common = await self._common_lexemes() if terms else []
        sql, params = _recall_sql(query, vector, terms, common, max(query.top_k * 4, 40), now)
        async with self._pool.connection() as conn:
            if terms:
                docs, avg_length = await self._scope_stats.get(conn, query.tenant, query.spaces)
                params.update(bm25_params(docs, avg_length))
            rows = await (await conn.execute(sql, params)).fetchall()
        end = 1 + len(MEMORY_FIELDS)  # rowid, the memory's columns, similarity, rank
        memories = {row[0]: memory_from_row(row[1:end]) for row in rows}
        vector_hits = sorted(
            ((row[0], row[end]) for row in rows if row[end] is not None), key=lambda h: -h[1]
        )
        text_hits = sorted(  # ties: the older memory first, as in the statement
            ((row[0], -row[end + 1]) for row in rows if row[end + 1] is not None),
            key=lambda h: (h[1], h[0]),
        )
        results = fuse(query, vector_hits, text_hits, memories, now, TEXT_KEY, self.fusion)
        if query.standing is None:
            return results
        return await with_standing_rules(self, query, results, query.standing)

    async def text_matches(
        self, tenant: str, spaces: list[str], words: list[str], after: int = 0, limit: int = 500
    ) -> tuple[list[Memory], int | None]:
        """Every active memory of `spaces` whose `tsv` holds all `words` (the English
        configuration's lexemes, through the GIN index), a page at a time; the cursor is
        `seq`. A page re-reads the matches' bitmap, so a sweep costs about matches x
        pages: in proportion to the memories holding the words, not to the tenant."""
        terms = match_input(tenant, spaces, words)
        if not terms:
            return [], None
        rows = await self.fetch(
            f"SELECT seq, {MEMORY_COLUMNS} FROM memories WHERE tenant = %s AND status = 'active'"
            " AND space = ANY(%s) AND (expires_at IS NULL OR expires_at > %s)"
            f" AND tsv @@ plainto_tsquery('{pg_lifecycle.TEXT_CONFIG}', %s) AND seq > %s"
            " ORDER BY seq LIMIT %s",
            (tenant, list(spaces), time.time(), " ".join(terms), after, limit),
        )
        cursor = rows[-1][0] if len(rows) == limit else None
        return [memory_from_row(row[1:]) for row in rows], cursor

    async def standing_candidates(
        self,
        query: RecallQuery,
        vector: np.ndarray,
        k: int,
        policy: StandingPolicy | None = None,
    ) -> Candidates:
        """The `k` standing rules of the query's scope nearest `vector`, guarded."""
        return await standing_candidates(self, query, vector, k, time.time())

    async def _common_lexemes(self) -> list[str]:
        """Lexemes in more than POSTINGS_BUDGET memories, from the planner's statistics
        (ANALYZE, run by autovacuum, keeps them); re-read every COMMON_TTL_S."""
        now = time.monotonic()
        if now < self._common_until:
            return self._common
        rows = await self.fetch(
            "SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs, c.reltuples"
            " FROM pg_stats s JOIN pg_class c ON c.relname = s.tablename"
            " AND c.relnamespace = to_regnamespace(s.schemaname)"
            " WHERE s.schemaname = current_schema() AND s.tablename = 'memories'"
            " AND s.attname = 'tsv'"
        )
        common: list[str] = []
        if rows and rows[0][0]:
            lexemes, freqs, tuples = rows[0]
            rows_total = max(float(tuples), 0.0)
            common = [
                lexeme
                for lexeme, freq in zip(lexemes, freqs, strict=False)
                if freq * rows_total > POSTINGS_BUDGET
            ]
        self._common, self._common_until = common, now + COMMON_TTL_S
        return common

    # -- transfer -------------------------------------------------------------------

    async def export(self, tenant: str) -> AsyncIterator[str]:
        """JSONL in batches of 200 memories, each with its events (constant memory)."""
        validate_id(tenant, "tenant")
        after = 0
        while True:
            rows = await self.fetch(
                f"SELECT seq, {MEMORY_COLUMNS} FROM memories WHERE tenant = %s AND seq > %s"
                " ORDER BY seq LIMIT 200",
                (tenant, after),
            )
            if not rows:
                return
            after = rows[-1][0]
            for row in rows:
                memory = memory_from_row(row[1:])
                yield transfer.export_line(memory, await self.history(tenant, memory.id))

    async def _import_batch(
        self, tenant: str, batch: list[tuple[int, dict[str, Any]]], result: ImportResult
    ) -> None:
        texts = import_texts(batch)
        vectors = iter(await self.embed(texts))
        async with self._pool.connection() as conn:
            for number, record in batch:
                needs_vector = record["status"] == "active" and bool(record.get("content"))
                vector = next(vectors) if needs_vector else None
                rows = await (
                    await conn.execute("SELECT tenant FROM memories WHERE id = %s", (record["id"],))
                ).fetchall()
                if rows:
                    if rows[0][0] == tenant:
                        result.skipped += 1
                    else:
                        result.errors.append(
                            transfer.transfer_conflict(number, record["id"], rows[0][0], tenant)
                        )
                    continue
                try:
                    async with conn.transaction():  # a savepoint per record
                        await _import_one(conn, tenant, record, vector)
                except (InvalidInput, KeyError, TypeError, ValueError, psycopg.DataError) as exc:
                    result.errors.append(f"line {number}: {exc}")
                else:
                    result.imported += 1


async def _import_one(
    conn: AsyncConnection, tenant: str, record: dict[str, Any], vector: Any
) -> None:
    space, new, options = transfer.imported_fields(record)
    memory = await pg_lifecycle.insert_memory(conn, tenant, space, new, vector, "import", **options)
    for event in transfer.imported_events(record):
        await pg_lifecycle.append_event(conn, memory, **event)


def _recall_sql(
    q: RecallQuery,
    vector: np.ndarray | None,
    terms: list[str],
    common: list[str],
    pool: int,
    now: float,
) -> tuple[str, dict[str, Any]]:
    """One statement: KNN and text candidates, then the guard over the rows they name."""
    params: dict[str, Any] = {"tenant": q.tenant, "spaces": list(q.spaces), "pool": pool}

    def in_scope(alias: str, kinds: bool = True) -> str:
        sql = (
            f"{alias}tenant = %(tenant)s AND {alias}status = 'active'"
            f" AND {alias}space = ANY(%(spaces)s)"
        )
        return sql + (f" AND {alias}kind = ANY(%(kinds)s)" if q.kinds and kinds else "")

    scope = in_scope("")
    if q.kinds:
        params["kinds"] = list(q.kinds)
    parts = []
    if vector is not None:
        params["vector"] = np.asarray(vector, np.float32)
        parts.append(
            "v AS (SELECT seq, 1 - (embedding <=> %(vector)s) AS similarity FROM memories"
            f" WHERE {scope} ORDER BY embedding <=> %(vector)s LIMIT %(pool)s)"
        )
    else:
        parts.append("v AS (SELECT NULL::bigint AS seq, NULL::float8 AS similarity LIMIT 0)")
    if terms:
        # The query's lexemes, minus those too common to be worth ranking (as with
        # SQLite's postings budget), scored with BM25 over the tenant's statistics: the
        # statistics count every kind, the kinds filter narrows the candidates only.
        params["terms"] = " ".join(terms)
        params["common"] = list(common)
        kinds = " AND tf.kind = ANY(%(kinds)s)" if q.kinds else ""
        parts.append(bm25_ctes(in_scope("", kinds=False), kinds, pg_lifecycle.TEXT_CONFIG))
    else:
        parts.append("x AS (SELECT NULL::bigint AS seq, NULL::float8 AS rank LIMIT 0)")
    sql = (
        f"WITH {', '.join(parts)} SELECT m.seq, "
        + ", ".join(f"m.{c.strip()}" for c in MEMORY_COLUMNS.split(","))
        + ", v.similarity, x.rank FROM memories m"
        " LEFT JOIN v ON v.seq = m.seq LEFT JOIN x ON x.seq = m.seq"
        " WHERE m.seq IN (SELECT seq FROM v UNION SELECT seq FROM x)"
        f" AND {in_scope('m.')} AND (m.expires_at IS NULL OR m.expires_at > %(now)s)"
    )
    params["now"] = now
    if q.subject:
        sql += " AND m.subject = %(subject)s"
        params["subject"] = q.subject
    return sql, params
