"""`X-Memrelay-Memory-Status` tells the truth: `queued` means a durable job, across
kill -9 of a real `memrelay serve` under streaming load, a database that refuses writes,
a full backlog and a repeated request."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from memory_core.sqlite.db import connect
from tests.fake_upstream import Recorded, Reply, completion, default_stream
from tests.test_replicas import Replica


class SlowAnswers:
    """Chat answers that take a while (streamed word by word, or JSON after a pause), so
    a kill lands before, during and right after answers; extraction calls get no facts."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, request: Recorded) -> Reply | None:
        if request.path != "/v1/chat/completions" or b"memrelay-extraction" in request.body:
            return None
        if json.loads(request.body).get("stream"):
            text = " ".join(f"word{i}" for i in range(self.rng.randint(3, 12)))
            return Reply.sse(default_stream(text), delay=self.rng.uniform(0.01, 0.08))
        return (
            Reply.json(completion("A plain answer."), headers={})
            if self.rng.random() < 0.3
            else (_delayed(completion("A slower plain answer."), self.rng.uniform(0.05, 0.5)))
        )


def _delayed(body: dict[str, Any], delay: float) -> Reply:
    reply = Reply.json(body)
    reply.first_delay = delay
    return reply


async def one_exchange(client: httpx.AsyncClient, url: str, text: str, stream: bool) -> dict:
    """Send one chat; report the status header and whether the whole answer arrived."""
    seen: dict[str, Any] = {"text": text, "status": None, "complete": False, "job": None}
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            seen["status"] = response.headers.get("x-memrelay-memory-status")
            seen["job"] = "job_" + response.headers.get("x-memrelay-request-id", "")
            if stream:
                async for line in response.aiter_lines():
                    if line.strip() == "data: [DONE]":
                        seen["complete"] = True
            else:
                raw = await response.aread()
                seen["complete"] = bool(json.loads(raw)["choices"])
    except (httpx.HTTPError, ValueError, KeyError):
        pass
    return seen


def durable_jobs(db: Path) -> dict[str, tuple[str, str | None]]:
    """Job id -> (status, user text while not done) of every job that is not a draft."""
    conn = connect(db)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        where = " WHERE draft = 0" if "draft" in columns else ""
        rows = conn.execute(f"SELECT id, status, payload FROM jobs{where}").fetchall()
    finally:
        conn.close()
    return {
        job_id: (status, json.loads(payload)["user"] if payload else None)
        for job_id, status, payload in rows
    }


@pytest.mark.slow
def test_no_exchange_answered_queued_is_lost_across_kill_9(fake, fake_url, tmp_path):
    """Ten rounds: a real server under streaming (and plain) load is killed at a random
    moment. Every exchange whose client got `queued` and the whole answer has a job; a
    restarted server then learns from every one of them."""
    fake.responder = SlowAnswers(seed=14)
    db = tmp_path / "kill.db"
    rng = random.Random(1414)
    outcomes: list[dict] = []
    for round_no in range(10):
        replica = Replica(str(db), fake_url, extraction_workers=0)

        async def load(replica: Replica = replica, round_no: int = round_no) -> list[dict]:
            async with httpx.AsyncClient(timeout=30) as client:
                tasks = []
                kill_at = time.monotonic() + rng.uniform(0.2, 2.0)
                n = 0
                while time.monotonic() < kill_at:
                    text = f"#{round_no}-{n}: tell me something"
                    tasks.append(
                        asyncio.create_task(
                            one_exchange(client, replica.url, text, stream=n % 4 != 3)
                        )
                    )
                    n += 1
                    await asyncio.sleep(rng.uniform(0.005, 0.06))
                await asyncio.to_thread(replica.kill)
                return list(await asyncio.gather(*tasks))

        outcomes += asyncio.run(load())
        replica.stop()
    promised = {o["job"]: o["text"] for o in outcomes if o["status"] == "queued" and o["complete"]}
    assert len(promised) >= 20, "the load never completed answers before the kills"
    assert any(o["status"] == "queued" and not o["complete"] for o in outcomes), (
        "no kill landed mid-answer"
    )
    durable = durable_jobs(db)
    lost = [text for job, text in promised.items() if durable.get(job, ("", None))[1] != text]
    assert lost == [], f"{len(lost)} of {len(promised)} exchanges answered queued were lost"
    # Restart: the jobs are there for a new process, which learns from all of them.
    replica = Replica(str(db), fake_url, extraction_workers=2)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            statuses = {job: status for job, (status, _user) in durable_jobs(db).items()}
            if all(statuses.get(job) == "done" for job in promised):
                break
            time.sleep(0.2)
        statuses = {job: status for job, (status, _user) in durable_jobs(db).items()}
        assert {statuses.get(job) for job in promised} == {"done"}
        ready = httpx.get(replica.url + "/memrelay/readyz", timeout=10).json()
        assert ready["learning"]["workers_alive"] == 2
    finally:
        replica.stop()
