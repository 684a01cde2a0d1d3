"""Extraction pipeline throughput with an instant LLM: exchanges per second from
enqueue to committed memories (embedding, reconciliation and SQLite writes included).

Run: .venv/bin/python bench/extraction_bench.py [--jobs 500] [--workers 2]
Target on a 2-core machine: >= 50 exchanges/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from extraction.reconcile import Reconciler
from extraction.worker import ExtractionWorkers
from memory_core import FastEmbedEmbedder, SQLiteStore
from memory_core.sqlite_jobs import SQLiteJobs

TOPICS = [
    "tea",
    "cycling",
    "Rust",
    "Lisbon",
    "chess",
    "piano",
    "sourdough",
    "hiking",
    "tax",
    "jazz",
]


class InstantLLM:
    """Answers at once: two facts per exchange, derived from the user text."""

    async def complete_json(
        self, messages: list[dict[str, Any]], schema: dict[str, Any], **_: Any
    ) -> Any:
        payload = json.loads(messages[-1]["content"])
        if "user" not in payload:
            return {"relation": "unrelated", "memory_id": None}
        n = payload["user"].split("#")[-1]
        topic = TOPICS[int(n) % len(TOPICS)]
        return {
            "facts": [
                {
                    "content": f"The user mentioned {topic} in message {n}",
                    "kind": "fact",
                    "confidence": 0.8,
                    "stated_by": "user",
                },
                {
                    "content": f"The user's favourite topic is {topic}",
                    "kind": "preference",
                    "subject": "user",
                    "attribute": "favourite_topic",
                    "value": topic,
                    "confidence": 0.8,
                    "stated_by": "user",
                },
            ]
        }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tenants", type=int, default=10)
    args = parser.parse_args()
    embedder = FastEmbedEmbedder()
    with tempfile.TemporaryDirectory() as tmp:
        store = await SQLiteStore.open(Path(tmp) / "bench.db", embedder)
        jobs = SQLiteJobs(store)
        llm = InstantLLM()
        workers = ExtractionWorkers(
            jobs, llm, Reconciler(store, llm), concurrency=args.workers, poll_seconds=0.01
        )
        for i in range(args.jobs):
            await jobs.enqueue(
                f"t{i % args.tenants}",
                "default",
                {"user": f"message #{i}", "assistant": "ok", "model": "m"},
            )
        started = time.perf_counter()
        await workers.start()
        while True:
            counts = await jobs.job_counts()
            if counts["pending"] == 0 and counts["leased"] == 0:
                break
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
        await workers.close()
        await store.close()
    print(
        f"{args.jobs} exchanges, {args.workers} workers: {args.jobs / elapsed:.1f} exchanges/s"
        f" ({counts['done']} done, {counts['dead']} dead)"
    )


if __name__ == "__main__":
    asyncio.run(main())
