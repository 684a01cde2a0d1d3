"""User time to first token on the embedded llama.cpp while extraction runs (issue 14).

Each mode starts a real `memrelay serve` with no upstream (embedded llama.cpp and the
bundled SmolLM2) on a fresh SQLite file holding `--jobs` extraction jobs, then sends
`--chats` streamed user chats one after another, with a pause before each in which
workers may claim jobs. Modes:

- `idle`: no workers (nothing competes with the user);
- `users-first`: the default with the embedded model (workers keep one slot free for
  users and claim no job while a chat is in flight);
- `unguarded`: the old behaviour (two workers, no yielding).

Prints one JSON object: TTFB and total time (ms, median and p90) per mode, and how many
jobs workers took up and finished meanwhile (so "fast" cannot mean "extraction did not
run").
Run: python -m bench.learning_ttfb [--jobs 30 --chats 8 --pause 1.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from memory_core import FastEmbedEmbedder, SQLiteStore
from memory_core.sqlite.jobs import SQLiteJobs
from tests.servers import free_port

MEMRELAY = str(Path(sys.executable).with_name("memrelay"))
MODES: dict[str, dict[str, str]] = {
    "idle": {"MEMRELAY_EXTRACTION_WORKERS": "0"},
    "users-first": {"MEMRELAY_EXTRACTION_WORKERS": "2"},
    "unguarded": {
        "MEMRELAY_EXTRACTION_WORKERS": "2",
        "MEMRELAY_EXTRACTION_YIELD_TO_CHATS": "false",
        "MEMRELAY_LOCAL_PARALLEL": "2",
    },
}


async def prefill(db: Path, jobs: int) -> None:
    store = await SQLiteStore.open(db, FastEmbedEmbedder())
    queue = SQLiteJobs(store)
    for n in range(jobs):
        await queue.enqueue(
            "bench",
            f"s{n % 4}",
            {
                "user": f"My locker number is {n} and I prefer tea number {n}.",
                "assistant": "Noted: your locker and your tea.",
                "model": "local",
                "request_id": f"bench{n}",
                "time": time.time(),
            },
        )
    await store.close()


def job_progress(db: Path) -> dict[str, int]:
    """Jobs a worker took up (leased at least once) and jobs done during the run."""
    from memory_core.sqlite.db import connect

    conn = connect(db)
    try:
        started, done = conn.execute(
            "SELECT count(*) FILTER (WHERE attempts > 0 OR status = 'done'),"
            " count(*) FILTER (WHERE status = 'done') FROM jobs"
        ).fetchone()
    finally:
        conn.close()
    return {"jobs_taken_up": started, "jobs_done": done}


def run_mode(name: str, env_extra: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="memrelay-ttfb-"))
    db = folder / "bench.db"
    asyncio.run(prefill(db, args.jobs))
    port = free_port()
    env = dict(os.environ, MEMRELAY_DB=str(db), MEMRELAY_PORT=str(port), **env_extra)
    env.setdefault("MEMRELAY_LOG_LEVEL", "warning")
    env.pop("MEMRELAY_UPSTREAM_URL", None)
    log = open(folder / "serve.log", "wb")
    process = subprocess.Popen([MEMRELAY, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    ttfbs: list[float] = []
    totals: list[float] = []
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/memrelay/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError((folder / "serve.log").read_text()[-2000:])
            time.sleep(0.2)
        with httpx.Client(timeout=300) as client:
            for n in range(args.chats):
                time.sleep(args.pause)  # workers may claim jobs now
                body = {
                    "model": "local",
                    "stream": True,
                    "max_tokens": 30,
                    "messages": [{"role": "user", "content": f"Say hello number {n}."}],
                }
                started = time.perf_counter()
                first = None
                with client.stream(
                    "POST",
                    url + "/v1/chat/completions",
                    json=body,
                    headers={"X-Memrelay-Memory": "read"},  # the user's chats add no jobs
                ) as response:
                    for line in response.iter_lines():
                        if first is None and line.startswith("data: {") and '"content"' in line:
                            first = time.perf_counter()
                ended = time.perf_counter()
                ttfbs.append(((first or ended) - started) * 1000)
                totals.append((ended - started) * 1000)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
    return {
        "ttfb_ms": _summary(ttfbs),
        "total_ms": _summary(totals),
        **job_progress(db),
    }


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 1),
        "p90": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 1),
        "n": len(ordered),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--pause", type=float, default=1.5)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    results = {name: run_mode(name, MODES[name], args) for name in args.modes.split(",")}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
