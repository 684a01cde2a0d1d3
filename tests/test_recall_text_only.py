"""Recall under an embedding backlog: full-text only, said in the response and counted.

A slow embedder (the real model behind a half-second wait per query call, like a
saturated core) makes the batcher measure a cost per query that no longer fits the
recall budget. The next recall must not wait for a vector it cannot get in time, nor
go out without memories: it searches full text only and says `text_only`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import openai
import pytest

from memory_core import SQLiteStore

FACT = "The user keeps bees in the garden"
QUESTION = "Tell me about my bees and the garden"


class SlowQueries:
    """The real embedder; each recall query call waits `delay` first."""

    def __init__(self, inner: Any, delay: float) -> None:
        self.inner, self.delay = inner, delay
        self.name, self.dim = inner.name, inner.dim
        self.calls = 0
        self.done = threading.Event()

    def embed(self, texts: list[str]) -> Any:
        return self.inner.embed(texts)

    def embed_query(self, text: str) -> Any:
        return self.inner.embed_query(text)

    def embed_queries(self, texts: list[str]) -> Any:
        time.sleep(self.delay)
        self.calls += 1
        try:
            return self.inner.embed(texts)
        finally:
            self.done.set()


@pytest.fixture
def slow_proxy(memory_proxy, embedder):
    slow = SlowQueries(embedder, delay=0.5)
    stores: list[SQLiteStore] = []

    def make(db: Any, _embedder: Any) -> SQLiteStore:
        stores.append(SQLiteStore(db, slow))
        return stores[-1]

    def start(**overrides: Any) -> tuple[Any, Any, SQLiteStore, SlowQueries]:
        server, seed = memory_proxy(store_class=make, recall_budget_ms=300, **overrides)
        seed.add("acme", "default", FACT)
        return server, seed, stores[-1], slow

    return start


def chat(server: Any, n: int) -> Any:
    """A chat completion whose question is new (number `n`): no cached query vector."""
    client = openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="sk-test",
        max_retries=0,
        default_headers={"X-Memrelay-Tenant": "acme"},
    )
    return client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": f"{QUESTION} (question {n})"}]
    )


def measured(store: SQLiteStore, slow: SlowQueries) -> None:
    assert slow.done.wait(30)  # the first query batch ran to its end (the worker goes on)
    for _ in range(3000):
        if store.batcher.seconds_per_text > 0:
            return
        time.sleep(0.01)
    raise AssertionError("the batcher never measured its cost per text")


def test_a_recall_predicted_to_miss_its_budget_is_text_only_and_says_so(fake, slow_proxy):
    server, _, store, slow = slow_proxy()
    first = chat(server, 1)  # nothing measured yet: it waits for the vector and times out
    assert first.headers["x-memrelay-recall-status"] == "timeout"
    measured(store, slow)
    calls = slow.calls
    second = chat(server, 2)
    assert second.headers["x-memrelay-recall-status"] == "text_only"
    assert second.headers["x-memrelay-recalled"] == "1"
    system = fake.chat_requests()[-1].json()["messages"][0]
    assert system["role"] == "system" and FACT in system["content"]
    assert slow.calls == calls  # no vector was asked for
    metrics = httpx.get(server.url + "/metrics").text
    assert 'memrelay_recall_total{status="text_only"} 1.0' in metrics


def test_vector_share_of_one_always_waits_for_the_vector(fake, slow_proxy):
    server, _, store, slow = slow_proxy(recall_vector_share=1.0)
    chat(server, 1)
    measured(store, slow)
    assert chat(server, 2).headers["x-memrelay-recall-status"] == "timeout"


def test_a_cached_query_vector_is_used_however_long_the_queue(fake, slow_proxy):
    server, _, store, slow = slow_proxy()
    chat(server, 1)
    measured(store, slow)
    again = chat(server, 1)  # the same question: its vector is cached, nothing to wait for
    assert again.headers["x-memrelay-recall-status"] == "ok"
