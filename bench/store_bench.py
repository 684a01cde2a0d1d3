"""Store-level benchmark: recall latency at 10k and 100k memories, and add throughput.

Run: .venv/bin/python bench/store_bench.py [--sizes 10000 100000] [--queries 200]

Filling 100k memories through the model would take minutes, so the fill embeds a few
thousand distinct generated sentences with the real model and derives the rest as
noisy copies of those vectors (the text varies too). Add throughput is measured
separately through `add_many` with real embedding. Numbers are medians and
percentiles of one run; compare them within a run, not across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from memory_core import FastEmbedEmbedder, NewMemory, RecallQuery, SQLiteStore

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
WHEN = [
    "on Mondays",
    "in the morning",
    "since last year",
    "before the deadline",
    "every week",
    "after lunch",
    "at the office",
    "during holidays",
]


def sentence(rng: random.Random, i: int) -> str:
    parts = (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(WHEN))
    return " ".join(parts) + f" (#{i})"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


async def fill(store: SQLiteStore, tenant: str, total: int, base: int, rng: random.Random) -> float:
    texts = [sentence(rng, i) for i in range(base)]
    base_vectors = store.embedder.embed(texts)
    started = time.perf_counter()
    done = 0
    nrng = np.random.default_rng(7)
    while done < total:
        n = min(2000, total - done)
        idx = [(done + j) % base for j in range(n)]
        vectors = base_vectors[idx] + nrng.normal(0, 0.02, (n, store.embedder.dim)).astype(
            np.float32
        )
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        items = [
            NewMemory(
                f"{texts[k]} v{done + j}",
                kind=rng.choice(["fact", "preference", "constraint", "error"]),
            )
            for j, k in enumerate(idx)
        ]
        await store.add_embedded(tenant, rng.choice(["default", "work"]), items, vectors)
        done += n
    return time.perf_counter() - started


async def recall_latency(store: SQLiteStore, tenant: str, queries: int, rng: random.Random) -> dict:
    texts = [
        f"what does {rng.choice(SUBJECTS).lower()} think about {rng.choice(OBJECTS)}"
        for _ in range(queries)
    ]
    full, store_only = [], []
    for text in texts[:20]:  # warm caches
        await store.recall(RecallQuery(tenant, ["default", "work"], text))
    for text in texts:
        t = time.perf_counter()
        await store.recall(RecallQuery(tenant, ["default", "work"], text, top_k=10))
        full.append((time.perf_counter() - t) * 1000)
    # Without query embedding: the vector is computed beforehand, as a cached query would be.
    vectors = store.embedder.embed(texts)
    original = store.embed

    for text, vector in zip(texts, vectors, strict=True):

        async def cached(_texts: list[str], v: np.ndarray = vector) -> np.ndarray:
            return v[None, :]

        store.embed = cached  # type: ignore[method-assign]
        t = time.perf_counter()
        await store.recall(RecallQuery(tenant, ["default", "work"], text, top_k=10))
        store_only.append((time.perf_counter() - t) * 1000)
    store.embed = original  # type: ignore[method-assign]
    return {
        "with_embedding_ms": {"p50": statistics.median(full), "p99": pct(full, 99)},
        "store_only_ms": {"p50": statistics.median(store_only), "p99": pct(store_only, 99)},
    }


async def add_throughput(store: SQLiteStore, count: int, rng: random.Random) -> float:
    items = [NewMemory(sentence(rng, i)) for i in range(count)]
    started = time.perf_counter()
    for i in range(0, count, 100):
        await store.add_many("throughput", "default", items[i : i + 100])
    return count / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--add", type=int, default=2000, help="memories for the add throughput run")
    parser.add_argument("--json", type=Path, help="write results here too")
    args = parser.parse_args()
    rng = random.Random(42)
    embedder = FastEmbedEmbedder()
    embedder.embed(["warm up"])
    results: dict = {"sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        store = await SQLiteStore.open(Path(tmp) / "bench.db", embedder)
        try:
            results["add_many_per_s"] = await add_throughput(store, args.add, rng)
            print(f"add_many with embedding: {results['add_many_per_s']:.0f} memories/s")
            filled = 0
            for size in sorted(args.sizes):
                seconds = await fill(store, "big", size - filled, min(5000, size), rng)
                filled = size
                latency = await recall_latency(store, "big", args.queries, rng)
                latency["fill_s"] = seconds
                results["sizes"][str(size)] = latency
                full, only = latency["with_embedding_ms"], latency["store_only_ms"]
                print(
                    f"{size:>8} memories: recall p50 {full['p50']:.1f} ms p99 {full['p99']:.1f} ms"
                    f" | store only p50 {only['p50']:.1f} ms p99 {only['p99']:.1f} ms"
                )
        finally:
            await store.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
