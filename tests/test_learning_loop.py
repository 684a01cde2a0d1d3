"""The extraction workers keep going: heartbeats keep leases, a lost lease or a dying
task never ends learning, finished jobs are pruned, and users' chats come first.

Real parts: a SQLite file, the extraction client against the fake upstream on
loopback; two worker groups with different owners stand in for two processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from extraction.llm import OpenAICompatibleLLM
from extraction.reconcile import Reconciler
from extraction.worker import ChatActivity, CredentialCache, ExtractionWorkers
from memory_core import SQLiteStore
from memory_core.sqlite.jobs import SQLiteJobs
from tests.fake_upstream import Recorded, Reply, completion


class SlowExtraction:
    """The extraction 'model': no facts (no JSON for users saying `fail`), after `delay`
    seconds; counts calls per user."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, request: Recorded) -> Reply | None:
        if b"memrelay-extraction" not in request.body:
            return None
        user = json.loads(request.json()["messages"][1]["content"])["user"]
        with self.lock:
            self.calls[user] = self.calls.get(user, 0) + 1
        answer = "no JSON here" if user.startswith("fail") else '{"facts": [], "forget": []}'
        reply = Reply.json(completion(answer))
        reply.first_delay = self.delay
        return reply


class StalledHeartbeat(SQLiteJobs):
    """A queue whose lease extensions never land, as when a process stalls: its leases
    run out while it works."""

    async def extend(self, job_id: str, owner: str, lease_seconds: float) -> bool:
        return True


def workers_on(
    queue: SQLiteJobs, url: str, owner: str, **options: Any
) -> tuple[ExtractionWorkers, OpenAICompatibleLLM]:
    llm = OpenAICompatibleLLM(url, model="m", timeout=10, attempts=1)
    options.setdefault("poll_seconds", 0.05)
    workers = ExtractionWorkers(queue, llm, Reconciler(queue.store, llm), **options)
    workers.owner = owner  # two groups in one test process stand for two processes
    return workers, llm


async def until(check: Callable[[], Awaitable[bool]], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


@pytest.fixture
def open_queue(tmp_path, embedder) -> Callable[..., Awaitable[SQLiteJobs]]:
    async def opener(kind: type[SQLiteJobs] = SQLiteJobs) -> SQLiteJobs:
        return kind(await SQLiteStore.open(tmp_path / "queue.db", embedder))

    return opener


def test_a_slow_model_call_keeps_its_lease(fake, fake_url, open_queue):
    """The call takes 4 leases' time; the heartbeat keeps the job with its worker, so
    another process never takes it and it runs once."""
    fake.responder = extraction = SlowExtraction(delay=1.2)

    async def main() -> None:
        queue = await open_queue()
        a, llm_a = workers_on(queue, fake_url, "host:1:aaaa", concurrency=1, lease_seconds=0.3)
        b, llm_b = workers_on(queue, fake_url, "host:2:bbbb", concurrency=1, lease_seconds=0.3)
        await queue.enqueue("acme", "default", {"user": "slow one"}, job_id="slow")
        await a.start()
        await until(lambda: _status(queue, "slow", "leased"))
        await b.start()
        await until(lambda: _status(queue, "slow", "done"))
        job = await queue.get_job("acme", "slow")
        for closing in (a, b, llm_a, llm_b):
            await (closing.close() if hasattr(closing, "close") else closing.aclose())
        await queue.store.close()
        assert job.attempts == 1
        assert extraction.calls == {"slow one": 1}

    asyncio.run(main())


def test_a_lost_lease_is_logged_and_the_worker_goes_on(fake, fake_url, open_queue, caplog):
    """A stalled process loses its lease to another: its complete() is refused; it logs
    that with the job id, leaves the job to the new owner, and keeps working."""
    fake.responder = extraction = SlowExtraction(delay=1.0)
    caplog.set_level(logging.WARNING, "memrelay.extraction")

    async def main() -> None:
        queue = await open_queue(StalledHeartbeat)
        a, llm_a = workers_on(queue, fake_url, "host:1:aaaa", concurrency=1, lease_seconds=0.3)
        b, llm_b = workers_on(queue, fake_url, "host:2:bbbb", concurrency=1, lease_seconds=30)
        await queue.enqueue("acme", "default", {"user": "contested"}, job_id="contested")
        await a.start()
        await until(lambda: _status(queue, "contested", "leased"))
        await asyncio.sleep(0.4)  # a's lease runs out while its model call is running
        await b.start()
        await until(lambda: _status(queue, "contested", "done"))
        await b.close()
        await until(lambda: _counted(a, "lease_lost"))
        extraction.delay = 0.0
        await queue.enqueue("acme", "other", {"user": "afterwards"}, job_id="afterwards")
        await until(lambda: _status(queue, "afterwards", "done"))
        assert a.alive == 1 and a.counts["done"] == 1  # a did the second job
        for closing in (a, llm_a, llm_b):
            await (closing.close() if hasattr(closing, "close") else closing.aclose())
        await queue.store.close()

    asyncio.run(main())
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert lost and "contested" in lost[0]


def test_a_worker_task_that_dies_is_restarted_and_counted(fake, fake_url, open_queue, caplog):
    fake.responder = SlowExtraction(delay=0.0)
    caplog.set_level(logging.ERROR, "memrelay.extraction")

    async def main() -> None:
        queue = await open_queue()
        workers, llm = workers_on(queue, fake_url, "host:1:aaaa", concurrency=2)
        await workers.start()
        victim = workers._tasks[0]
        victim.cancel()  # as if something outside any job ended it
        await until(lambda: _true(workers.alive == 2 and workers._tasks[0] is not victim))
        assert workers.counts["restarts"] == 1
        health = await workers.health()
        assert health["workers_alive"] == 2 and health["worker_restarts"] == 1
        await queue.enqueue("acme", "default", {"user": "still learning"}, job_id="j")
        await until(lambda: _status(queue, "j", "done"))
        await workers.close()
        await llm.aclose()
        await queue.store.close()

    asyncio.run(main())
    assert any("restarting" in r.getMessage() for r in caplog.records)


def test_last_error_names_the_cause(fake, open_queue):
    async def main() -> None:
        queue = await open_queue()
        workers, llm = workers_on(
            queue, "http://127.0.0.1:9", "host:1:aaaa", concurrency=1, retry_base_seconds=30
        )
        await queue.enqueue("acme", "default", {"user": "x"}, job_id="j")
        await workers.start()
        await until(lambda: _counted(workers, "failed"))
        job = await queue.get_job("acme", "j")
        await workers.close()
        await llm.aclose()
        await queue.store.close()
        assert job.status == "pending" and "connection refused" in job.last_error

    asyncio.run(main())


def test_workers_wait_while_users_chat(fake, fake_url, open_queue):
    """With the embedded llama.cpp, users first: no claim while a chat is in flight."""
    fake.responder = SlowExtraction(delay=0.0)

    async def main() -> None:
        queue = await open_queue()
        chats = ChatActivity()
        workers, llm = workers_on(queue, fake_url, "host:1:aaaa", concurrency=2, yield_to=chats)
        await workers.start()
        chats.begin()
        await queue.enqueue("acme", "default", {"user": "later"}, job_id="j")
        workers.wake()
        await asyncio.sleep(0.5)
        assert (await queue.get_job("acme", "j")).status == "pending"
        assert (await workers.health())["yielding_to_chats"] is True
        chats.end()
        await until(lambda: _status(queue, "j", "done"))
        await workers.close()
        await llm.aclose()
        await queue.store.close()

    asyncio.run(main())


def test_done_jobs_are_pruned_dead_jobs_kept(fake, fake_url, open_queue):
    fake.responder = SlowExtraction(delay=0.0)

    async def main() -> None:
        queue = await open_queue()
        workers, llm = workers_on(
            queue,
            fake_url,
            "host:1:aaaa",
            concurrency=1,
            done_retention_seconds=0.2,
            prune_every_seconds=0.1,
        )
        await queue.enqueue("acme", "s1", {"user": "learned"}, job_id="done")
        await queue.enqueue("acme", "s2", {"user": "fail"}, job_id="dead", max_attempts=1)
        await workers.start()
        await until(lambda: _true(workers.counts["pruned"] >= 1))
        left = {j.id: j.status for j in await queue.list_jobs("acme")}
        await workers.close()
        await llm.aclose()
        await queue.store.close()
        assert left == {"dead": "dead"}  # unusable model output: dead-lettered, and kept

    asyncio.run(main())


def test_credentials_of_queued_jobs_are_never_evicted():
    cache = CredentialCache()
    for n in range(10_050):
        cache.put(f"job{n}", {"authorization": f"Bearer {n}"})
    assert cache.get("job0") == {"authorization": "Bearer 0"} and len(cache) == 10_050


async def _status(queue: SQLiteJobs, job_id: str, status: str) -> bool:
    job = await queue.get_job("acme", job_id)
    return job is not None and job.status == status


async def _counted(workers: ExtractionWorkers, outcome: str) -> bool:
    return workers.counts[outcome] > 0


async def _true(value: bool) -> bool:
    return value
