"""Recall latency as one tenant grows: SQLite and Postgres, store-level and end to end.

For each size: p50/p99 of store-level recall (query vector given, as a cached query
would be) and with query embedding, the end-to-end time-to-first-byte that memory adds
through a served memrelay (memory on minus memory off, interleaved), the database's
size on disk, and the peak resident memory of this process (the SQLite vector cache
lives here; for Postgres the server's own memory is reported beside it).

Filling a million memories through the model would take hours, so the fill embeds a
few thousand distinct sentences with the real model and derives the rest as noisy
copies of those vectors (texts vary too). SQLite is filled through the store's own add
path; Postgres is bulk-loaded as an operator would (COPY, then the HNSW index built
once), except for small steps, which go through the add path too.
"""

from __future__ import annotations

import asyncio
import random
import resource
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common import pct, served_fake_upstream, summary, ttfb
from memory_core import FastEmbedEmbedder, NewMemory, RecallQuery
from memory_core.backends import make_store
from memory_core.model import content_hash, new_memory_id
from proxy.settings import Settings
from proxy.wiring import build_app
from tests.servers import ServedApp

SUBJECTS = ["The user", "My manager", "The client", "Our team", "My sister", "The landlord"]
VERBS = ["prefers", "dislikes", "asked about", "is planning", "forgot", "wants to learn"]
OBJECTS = [
    "green tea",
    "rust programming",
    "the quarterly report",
    "a trip to Lisbon",
    "formal emails",
    "jazz piano",
    "the database migration",
    "vegan recipes",
    "the tax deadline",
    "marathon training",
    "the new laptop",
    "birthday gifts",
]
WHEN = ["on Mondays", "in the morning", "since last year", "before the deadline", "every week"]
TENANT = "big"
SPACES = ["default", "work"]


def sentence(rng: random.Random, i: int) -> str:
    parts = (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(WHEN))
    return " ".join(parts) + f" (#{i})"


class Filler:
    """Adds synthetic memories to one tenant in batches, through the store's add path."""

    def __init__(self, embedder: FastEmbedEmbedder, base: int = 5000) -> None:
        self.rng = random.Random(42)
        self.noise = np.random.default_rng(7)
        self.texts = [sentence(self.rng, i) for i in range(base)]
        self.vectors = embedder.embed(self.texts)
        self.dim = embedder.dim
        self.done = 0

    def next_block(self, total: int) -> tuple[str, list[NewMemory], np.ndarray]:
        n = min(2000, total - self.done)
        idx = [(self.done + j) % len(self.texts) for j in range(n)]
        block = self.vectors[idx] + self.noise.normal(0, 0.02, (n, self.dim)).astype(np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        items = [
            NewMemory(
                f"{self.texts[k]} v{self.done + j}",
                kind=self.rng.choice(["fact", "preference", "constraint", "error"]),
            )
            for j, k in enumerate(idx)
        ]
        self.done += n
        return self.rng.choice(SPACES), items, block

    async def fill_to(self, store: Any, total: int, tenant: str = TENANT) -> float:
        """Through the store's own add path (memories, indexes and events)."""
        started = time.perf_counter()
        while self.done < total:
            space, items, block = self.next_block(total)
            await store.add_embedded(tenant, space, items, block)
        return time.perf_counter() - started

    async def copy_to(self, store: Any, total: int) -> float:
        """Postgres bulk load: COPY into a staging table, then one INSERT ... SELECT that
        fills the text-search vector and writes each memory's `added` event."""
        started = time.perf_counter()
        async with store.connection() as conn:
            await conn.execute(
                "CREATE TEMP TABLE staging (id text, space text, kind text, content text,"
                f" content_hash text, at float8, embedding vector({self.dim}))"
            )
            async with conn.cursor() as cursor:
                async with cursor.copy("COPY staging FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(["text", "text", "text", "text", "text", "float8", "vector"])
                    while self.done < total:
                        space, items, block = self.next_block(total)
                        now = time.time()
                        for item, vector in zip(items, block, strict=True):
                            memory_id = new_memory_id()
                            digest = content_hash(TENANT, space, item.content)
                            await copy.write_row(
                                (memory_id, space, item.kind, item.content, digest, now, vector)
                            )
            await conn.execute(
                "INSERT INTO memories (id, tenant, space, kind, content, confidence, source,"
                " status, created_at, updated_at, content_hash, embedding, tsv)"
                " SELECT id, %s, space, kind, content, 0.8, 'user', 'active', at, at,"
                " content_hash, embedding, to_tsvector('english', content) FROM staging",
                (TENANT,),
            )
            await conn.execute(
                "INSERT INTO events (event_id, memory_id, tenant, space, action, actor, at,"
                " detail) SELECT md5(id), id, %s, space, 'added', 'bulk-load', at,"
                " jsonb_build_object('kind', kind) FROM staging",
                (TENANT,),
            )
            await conn.execute("DROP TABLE staging")
        return time.perf_counter() - started


def queries(count: int) -> list[str]:
    rng = random.Random(9)
    return [
        f"what does {rng.choice(SUBJECTS).lower()} think about {rng.choice(OBJECTS)}"
        for _ in range(count)
    ]


async def store_latency(store: Any, texts: list[str]) -> dict[str, Any]:
    for text in texts[:20]:  # warm caches
        await store.recall(RecallQuery(TENANT, SPACES, text))
    full = []
    for text in texts:
        store.batcher.cache.clear()  # the texts repeat: time the embedding every time
        t = time.perf_counter()
        await store.recall(RecallQuery(TENANT, SPACES, text, top_k=10))
        full.append((time.perf_counter() - t) * 1000)
    vectors = store.embedder.embed(texts)
    only = []
    try:
        for text, vector in zip(texts, vectors, strict=True):

            async def given(_query: Any, _text: str, v: np.ndarray = vector) -> np.ndarray:
                return v

            store.embed_query = given
            t = time.perf_counter()
            await store.recall(RecallQuery(TENANT, SPACES, text, top_k=10))
            only.append((time.perf_counter() - t) * 1000)
    finally:
        del store.embed_query  # back to the class's method
    return {"store_only_ms": summary(only), "with_embedding_ms": summary(full)}


def end_to_end(db: Any, embedder: FastEmbedEmbedder, texts: list[str]) -> dict[str, Any]:
    """TTFB through a served memrelay, memory on vs off, interleaved, concurrency 1."""
    with served_fake_upstream() as upstream:
        settings = Settings(upstream_url=upstream.url, db=db, extraction_workers=0)
        store = make_store(db, embedder)
        with ServedApp(build_app(settings, store=store)) as memrelay, httpx.Client() as client:
            warm_up(client, memrelay.url, TENANT, SPACES)
            on: list[float] = []
            off: list[float] = []
            for i, text in enumerate(texts):
                for mode, sink in (("read", on), ("off", off)):
                    headers = {"X-Memrelay-Tenant": TENANT, "X-Memrelay-Memory": mode}
                    headers["X-Memrelay-Read-Spaces"] = ",".join(SPACES)
                    value = ttfb(client, memrelay.url, headers, text)[0]
                    if i >= 10:
                        sink.append(value)
    added = [a - b for a, b in zip(on, off, strict=True)]
    return {
        "memory_on_ttfb_ms": summary(on),
        "memory_off_ttfb_ms": summary(off),
        "added_p50_ms": statistics.median(on) - statistics.median(off),
        "added_p99_ms": pct(on, 99) - pct(off, 99),
        "paired_added_p50_ms": statistics.median(added),
    }


def warm_up(client: httpx.Client, url: str, tenant: str, spaces: list[str]) -> None:
    """Ask until recall answers within its budget: a fresh process first reads the
    tenant's vectors into its cache, and requests meanwhile go on without memories."""
    headers = {
        "X-Memrelay-Tenant": tenant,
        "X-Memrelay-Memory": "read",
        "X-Memrelay-Read-Spaces": ",".join(spaces),
    }
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        response = client.post(
            url + "/v1/chat/completions",
            headers=headers,
            json={"model": "m", "messages": [{"role": "user", "content": "warm up tea"}]},
        )
        if response.headers.get("x-memrelay-recall-status") in ("ok", "empty"):
            return
        time.sleep(0.5)
    raise RuntimeError("recall never came within its budget")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def size_on_disk(store: Any, db: Any) -> float:
    if hasattr(store, "fetch"):
        rows = await store.fetch("SELECT pg_database_size(current_database())")
        return rows[0][0] / 1e6
    path = Path(db)
    files = [path, path.with_name(path.name + "-wal")]
    return sum(f.stat().st_size for f in files if f.exists()) / 1e6


def postgres_server_rss_mb() -> float:
    import psutil

    total = 0
    for proc in psutil.process_iter(["name", "memory_info"]):
        if proc.info["name"] == "postgres" and proc.info["memory_info"]:
            total += proc.info["memory_info"].rss
    return total / 1e6


async def run_backend(
    backend: str,
    db: Any,
    sizes: list[int],
    embedder: FastEmbedEmbedder,
    query_count: int,
    e2e_count: int,
) -> dict[str, Any]:
    store = make_store(db, embedder)
    await store.start()
    filler = Filler(embedder, base=min(5000, max(sizes)))
    texts = queries(query_count)
    out: dict[str, Any] = {}
    try:
        for size in sorted(sizes):
            if backend == "postgres":
                fill_s = await bulk_fill_postgres(store, filler, size)
            else:
                fill_s = await filler.fill_to(store, size)
            result = await store_latency(store, texts)
            result["fill_s"] = round(fill_s, 1)
            result["db_mb"] = round(await size_on_disk(store, db), 1)
            result["peak_rss_mb"] = round(peak_rss_mb(), 1)
            if backend == "postgres":
                result["postgres_server_rss_mb"] = round(postgres_server_rss_mb(), 1)
            await store.close()
            result["end_to_end"] = await asyncio.to_thread(
                end_to_end, db, embedder, texts[: e2e_count + 10]
            )
            if backend == "sqlite":
                result["restart"] = await restart_ready(db, embedder, texts)
            store = make_store(db, embedder)
            await store.start()
            out[str(size)] = result
            only = result["store_only_ms"]
            print(
                f"  {backend} {size:>8}: store p50 {only['p50']:.1f} ms p99 {only['p99']:.1f}"
                f" | e2e added p50 {result['end_to_end']['added_p50_ms']:.1f} ms"
                f" | {result['db_mb']:.0f} MB | rss {result['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    finally:
        await store.close()
    return out


async def restart_ready(db: Any, embedder: FastEmbedEmbedder, texts: list[str]) -> dict[str, Any]:
    """Seconds from opening the store (schema check, model load) to the first recall that
    answers within a 200 ms budget: from the vector snapshot the last close wrote, and
    with the snapshot moved away (the cache then reads every vector from sqlite-vec and
    writes a new snapshot, which is put back afterwards)."""
    # A new process also loads the embedding model; the store here reuses a loaded one,
    # so that part is timed on its own and added.
    started = time.perf_counter()
    FastEmbedEmbedder(getattr(embedder, "model_dir", None)).embed(["warm up"])
    out: dict[str, Any] = {"model_load_s": round(time.perf_counter() - started, 2)}
    folder = Path(str(db) + ".vectors")
    aside = Path(str(db) + ".vectors-aside")
    for mode in ("snapshot", "no snapshot"):
        if mode == "no snapshot" and not _swap(folder, aside):
            continue
        try:
            started = time.perf_counter()
            store = make_store(db, embedder)
            await store.start()
            opened = time.perf_counter() - started
            attempts = 0
            while True:
                attempts += 1
                try:
                    await asyncio.wait_for(
                        store.recall(RecallQuery(TENANT, SPACES, texts[attempts % len(texts)])),
                        0.2,
                    )
                    break
                except TimeoutError:
                    await asyncio.sleep(0.05)
            ready = time.perf_counter() - started
            cached = getattr(store, "_cache", None)
            source = cached._tenants[TENANT].loaded_from if cached is not None else ""
            await store.close()
        finally:
            if mode == "no snapshot":
                shutil.rmtree(folder, ignore_errors=True)
                _swap(aside, folder)
        out[mode] = {
            "open_s": round(opened, 2),
            "ready_s": round(ready + out["model_load_s"], 2),
            "attempts": attempts,
            "loaded_from": source,
        }
        print(
            f"  restart ({mode}): ready in {out[mode]['ready_s']:.2f} s"
            f" (open {opened:.2f} s, {source})"
        )
    return out


def _swap(source: Path, target: Path) -> bool:
    if not source.exists():
        return False
    source.rename(target)
    return True


async def bulk_fill_postgres(store: Any, filler: Filler, size: int) -> float:
    """Drop the HNSW index, COPY, build it once (as for any large pgvector load)."""
    started = time.perf_counter()
    if size - filler.done > 20_000:
        async with store.connection() as conn:
            await conn.execute("DROP INDEX IF EXISTS memories_embedding")
        await filler.copy_to(store, size)
        async with store.connection() as conn:
            await conn.set_autocommit(True)
            await conn.execute("SET maintenance_work_mem = '4GB'")
            await conn.execute("SET max_parallel_maintenance_workers = 1")
            await conn.execute(
                "CREATE INDEX memories_embedding ON memories USING hnsw"
                " (embedding vector_cosine_ops) WHERE status = 'active'"
            )
            await conn.execute("ANALYZE memories")
            await conn.set_autocommit(False)
    else:
        await filler.fill_to(store, size)
        async with store.connection() as conn:
            await conn.execute("ANALYZE memories")
    return time.perf_counter() - started


def run(
    sizes: list[int],
    pg_sizes: list[int],
    workdir: Path,
    embedder: FastEmbedEmbedder,
    pg: Any,
    query_count: int = 200,
    e2e_count: int = 100,
) -> dict[str, Any]:
    results: dict[str, Any] = {
        "setup": (
            f"One tenant, two spaces, synthetic memories; {query_count} queries per size,"
            " top 10. Store-level = recall with the query vector given; with embedding ="
            " the whole recall call; e2e added = TTFB through a served memrelay with memory"
            f" on minus memory off ({e2e_count} interleaved requests). SQLite keeps a vector"
            " cache in process; Postgres uses HNSW (ef_search 100, iterative scan)."
        ),
        "sqlite": {},
        "postgres": {},
    }
    if sizes:
        results["sqlite"] = asyncio.run(
            run_backend("sqlite", workdir / "scaling.db", sizes, embedder, query_count, e2e_count)
        )
    if pg_sizes and pg is not None:
        results["postgres"] = asyncio.run(
            run_backend(
                "postgres", pg.new_database("scaling"), pg_sizes, embedder, query_count, e2e_count
            )
        )
    return results
