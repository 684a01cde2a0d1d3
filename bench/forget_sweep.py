"""What a forget request in words costs in a large tenant: the full-text sweep.

One tenant of 20,000 memories in one space (random unit vectors: the sweep reads the
text index only; texts through the store's real add path and index), 50 of them
holding "locker code". Times every page of `text_matches` for a rare pair of words
(50 matches) and for a word every memory holds (20,000 matches, the worst case), best
of 3, then one `forget_request("my locker code")` (recall, sweep and 50 forgets).

    python -m bench.forget_sweep sqlite|postgres
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from extraction.forget_words import FORGET_PAGE
from extraction.reconcile import Reconciler
from memory_core import FastEmbedEmbedder, NewMemory, SQLiteStore

SIZE, MATCHES = 20_000, 50
NOUNS = "bike garden coffee jazz office piano hiking sister budget train kitchen novel".split()


def texts() -> list[str]:
    out = []
    for i in range(SIZE):
        if i % (SIZE // MATCHES) == 7:
            out.append(f"The user's locker code at site {i} is {1000 + i % 9000}")
        else:
            out.append(f"The user mentioned the {NOUNS[i % len(NOUNS)]} on day {i}")
    return out


async def sweep(store: Any, words: list[str]) -> tuple[int, float]:
    best, found = float("inf"), 0
    for _ in range(3):
        started, found, after = time.perf_counter(), 0, 0
        while after is not None:
            page, after = await store.text_matches("acme", ["personal"], words, after, FORGET_PAGE)
            found += len(page)
        best = min(best, time.perf_counter() - started)
    return found, best * 1000


async def main(kind: str) -> None:
    embedder = FastEmbedEmbedder()
    embedder.embed(["warm up"])
    server = None
    if kind == "postgres":
        from memory_core.postgres.store import PostgresStore
        from tests.postgres import EmbeddedPostgres

        server = EmbeddedPostgres()
        store: Any = await PostgresStore.open(server.new_database(), embedder)
    else:
        store = await SQLiteStore.open(Path(tempfile.mkdtemp()) / "memory.db", embedder)
    rng = np.random.default_rng(1)
    every = texts()
    for start in range(0, SIZE, 1000):
        batch = every[start : start + 1000]
        vectors = rng.standard_normal((len(batch), embedder.dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        await store.add_embedded("acme", "personal", [NewMemory(t) for t in batch], vectors)
    for words in (["locker", "code"], ["user"]):
        found, ms = await sweep(store, words)
        print(f"{kind}: sweep {' '.join(words)!r}: {found} matches, {ms:.1f} ms (best of 3)")
    started = time.perf_counter()
    outcomes = await Reconciler(store, None).forget_request("acme", ["personal"], "my locker code")
    forgotten = sum(o.action == "forgotten" for o in outcomes)
    print(f"{kind}: forget_request: {forgotten} forgotten in {time.perf_counter() - started:.2f} s")
    await store.close()
    if server is not None:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite"))
