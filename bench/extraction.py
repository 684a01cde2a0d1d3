"""Extraction pipeline throughput with an instant LLM: exchanges per second from
enqueue to committed memories (embedding, reconciliation and SQLite writes included).

Part of `python -m bench.run` (section `extraction`): SQLite in one process, and
Postgres with one and with two replica processes sharing the queue.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from extraction.reconcile import Reconciler
from extraction.worker import ExtractionWorkers
from memory_core import FastEmbedEmbedder
from memory_core.backends import jobs_for, make_store

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


def make_workers(store: Any, concurrency: int) -> tuple[Any, ExtractionWorkers]:
    jobs = jobs_for(store)
    llm = InstantLLM()
    workers = ExtractionWorkers(
        jobs, llm, Reconciler(store, llm), concurrency=concurrency, poll_seconds=0.01
    )
    return jobs, workers


async def enqueue(jobs: Any, count: int, tenants: int = 10) -> None:
    for i in range(count):
        await jobs.enqueue(
            f"t{i % tenants}", "default", {"user": f"message #{i}", "assistant": "ok", "model": "m"}
        )


async def drain(jobs: Any, total: int, limit_s: float = 900) -> dict[str, int]:
    async with asyncio.timeout(limit_s):
        while True:
            counts = await jobs.job_counts()
            if counts["done"] + counts["dead"] >= total:
                return counts
            await asyncio.sleep(0.05)


async def in_process(db: Any, embedder: Any, count: int, concurrency: int) -> dict[str, Any]:
    """Enqueue `count` exchanges, then time workers in this process until all are done."""
    store = make_store(db, embedder)
    await store.start()
    jobs, workers = make_workers(store, concurrency)
    try:
        await enqueue(jobs, count)
        started = time.perf_counter()
        await workers.start()
        counts = await drain(jobs, count)
        elapsed = time.perf_counter() - started
    finally:
        await workers.close()
        await store.close()
    return _result(count, elapsed, counts)


def replicas(url: str, embedder: Any, count: int, processes: int, concurrency: int) -> dict:
    """`processes` replica processes (workers only) on one Postgres database."""
    return asyncio.run(_replicas(url, embedder, count, processes, concurrency))


async def _replicas(
    url: str, embedder: Any, count: int, processes: int, concurrency: int
) -> dict[str, Any]:
    store = make_store(url, embedder)  # enqueues, then watches the queue drain
    await store.start()
    jobs = jobs_for(store)
    try:
        await enqueue(jobs, count)
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.extraction",
                url,
                str(concurrency),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            for _ in range(processes)
        ]
        try:
            for proc in procs:  # each loads its model and opens its pool first
                assert proc.stdout is not None
                assert (await proc.stdout.readline()).strip() == b"ready"
            started = time.perf_counter()
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
            counts = await drain(jobs, count)
            elapsed = time.perf_counter() - started
        finally:
            for proc in procs:
                if proc.stdin:
                    proc.stdin.close()
                await asyncio.wait_for(proc.wait(), 60)
    finally:
        await store.close()
    return _result(count, elapsed, counts)


def _result(count: int, elapsed: float, counts: dict[str, int]) -> dict[str, Any]:
    return {
        "jobs": count,
        "seconds": round(elapsed, 2),
        "exchanges_per_s": round(count / elapsed, 1),
        "done": counts["done"],
        "dead": counts["dead"],
    }


def run(work: Path, embedder: Any, pg: Any, jobs: int) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    runs["sqlite, 1 process, 2 workers"] = asyncio.run(
        in_process(work / "extraction.db", embedder, jobs, 2)
    )
    if pg is not None:
        for processes in (1, 2):
            label = f"postgres, {processes} replica(s) x 2 workers"
            runs[label] = replicas(pg.new_database("extract"), embedder, jobs, processes, 2)
    for label, result in runs.items():
        print(f"  {label}: {result['exchanges_per_s']} exchanges/s", flush=True)
    return {
        "setup": (
            f"{jobs} queued exchanges over 10 tenants, an instant fake LLM returning two facts"
            " each (embedding, reconciliation and writes included); timed from the workers'"
            " start to the last job done. Replicas are separate processes."
        ),
        "runs": runs,
    }


async def _replica(url: str, concurrency: int) -> None:
    """A replica's extraction side: open, say ready, wait for go, work until stdin closes."""
    store = make_store(url, FastEmbedEmbedder())
    await store.start()
    _, workers = make_workers(store, concurrency)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    await workers.start()
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await workers.close()
    await store.close()


if __name__ == "__main__":
    asyncio.run(_replica(sys.argv[1], int(sys.argv[2])))
