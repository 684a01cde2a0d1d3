"""Shared pieces of the benchmarks: the paced fake upstream, timing, summaries."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np

from tests.fake_upstream import FakeUpstream, Reply, default_stream
from tests.servers import ServedApp

CHUNKS = 20  # words in the fixed streamed reply
PACE_S = 0.002  # seconds between chunks


def paced_reply() -> Reply:
    """A fixed streamed answer: CHUNKS content chunks, PACE_S apart."""
    text = " ".join(f"word{i}" for i in range(CHUNKS))
    return Reply.sse(default_stream(text), delay=PACE_S)


@contextlib.contextmanager
def served_fake_upstream() -> Iterator[ServedApp]:
    """The fake upstream in this process (fine at concurrency 1)."""
    fake = FakeUpstream()
    fake.responder = lambda request: paced_reply()
    with ServedApp(fake) as served:
        yield served


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 3) if values else float("nan"),
        "p99": round(pct(values, 99), 3),
        "n": len(values),
    }


def chat_body(text: str, model: str = "fake-model") -> dict[str, Any]:
    return {"model": model, "stream": True, "messages": [{"role": "user", "content": text}]}


def ttfb(
    client: httpx.Client, url: str, headers: dict[str, str], text: str, path: str = "/v1"
) -> tuple[float, float]:
    """(time to first body byte, total time) in ms for one streamed chat completion."""
    started = time.perf_counter()
    with client.stream(
        "POST", url + path + "/chat/completions", headers=headers, json=chat_body(text)
    ) as response:
        chunks = response.iter_raw()
        next(chunks)
        first = time.perf_counter() - started
        for _ in chunks:
            pass
    return first * 1000, (time.perf_counter() - started) * 1000
