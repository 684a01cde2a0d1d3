"""Added latency before the first byte: memrelay with memory on (10k memories in the
tenant) against memory off, and both against calling the upstream directly.

Run: .venv/bin/python bench/injection_bench.py [--memories 10000] [--requests 300]

A fake upstream on loopback streams a fixed reply; clients measure time to the first
body byte. Medians and p99 of one run; the difference between modes is what counts.
Target on a 2-core machine: memory on adds <= 15 ms p50 over memory off.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memory_core import FastEmbedEmbedder, NewMemory, SQLiteStore
from proxy.settings import Settings
from proxy.wiring import build_app
from tests.fake_upstream import FakeUpstream, Reply, default_stream
from tests.servers import ServedApp

TOPICS = ["tea", "rust", "lisbon", "chess", "piano", "taxes", "hiking", "jazz", "sourdough"]


async def fill(db: Path, embedder: FastEmbedEmbedder, count: int) -> None:
    store = await SQLiteStore.open(db, embedder)
    rng = random.Random(3)
    base = [
        f"The user mentioned {rng.choice(TOPICS)} while talking about {rng.choice(TOPICS)} #{i}"
        for i in range(min(count, 2000))
    ]
    vectors = embedder.embed(base)
    noise = np.random.default_rng(1)
    done = 0
    while done < count:
        n = min(2000, count - done)
        idx = [(done + j) % len(base) for j in range(n)]
        block = vectors[idx] + noise.normal(0, 0.02, (n, embedder.dim)).astype(np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        await store.add_embedded(
            "bench",
            "default",
            [NewMemory(base[k] + f" v{done + j}") for j, k in enumerate(idx)],
            block,
        )
        done += n
    await store.close()


def ttfb(client: httpx.Client, url: str, headers: dict[str, str], text: str) -> float:
    started = time.perf_counter()
    with client.stream(
        "POST",
        url + "/v1/chat/completions",
        headers=headers,
        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]},
    ) as response:
        chunks = response.iter_raw()
        next(chunks)
        elapsed = time.perf_counter() - started
        for _ in chunks:
            pass
    return elapsed * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    embedder = FastEmbedEmbedder()
    fake = FakeUpstream()
    fake.responder = lambda request: Reply.sse(
        default_stream("A short fixed streamed reply for benchmarking.")
    )
    with tempfile.TemporaryDirectory() as tmp, ServedApp(fake) as upstream:
        db = Path(tmp) / "bench.db"
        asyncio.run(fill(db, embedder, args.memories))
        settings = Settings(upstream_url=upstream.url, db=db, extraction_workers=0)
        store = SQLiteStore(db, embedder)
        with (
            ServedApp(build_app(settings, store=store)) as memrelay,
            httpx.Client(timeout=30) as client,
        ):
            rng = random.Random(9)
            modes = {
                "direct": (upstream.url, {}),
                "memory off": (
                    memrelay.url,
                    {"X-Memrelay-Tenant": "bench", "X-Memrelay-Memory": "off"},
                ),
                "memory on": (
                    memrelay.url,
                    {"X-Memrelay-Tenant": "bench", "X-Memrelay-Memory": "read"},
                ),
            }
            results: dict[str, list[float]] = {mode: [] for mode in modes}
            for i in range(args.requests + 20):  # interleaved, so drift hits every mode alike
                text = f"What do you remember about {rng.choice(TOPICS)} and {rng.choice(TOPICS)}?"
                for mode, (url, headers) in modes.items():
                    value = ttfb(client, url, headers, text)
                    if i >= 20:  # warm-up
                        results[mode].append(value)
    print(
        f"{args.memories} memories in the tenant, {args.requests} requests per mode, concurrency 1"
    )
    print(f"{'mode':<12} {'ttfb p50 ms':>12} {'ttfb p99 ms':>12}")
    for mode, values in results.items():
        print(
            f"{mode:<12} {statistics.median(values):>12.2f}"
            f" {float(np.percentile(values, 99)):>12.2f}"
        )
    on, off = statistics.median(results["memory on"]), statistics.median(results["memory off"])
    direct = statistics.median(results["direct"])
    print(
        f"memory on adds {on - off:.2f} ms p50 over memory off;"
        f" memory off adds {off - direct:.2f} ms"
        " over direct"
    )


if __name__ == "__main__":
    main()
