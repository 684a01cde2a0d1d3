"""Two memrelay processes sharing one Postgres: one memory, one queue, one replica killed.

Each replica is a real `memrelay serve` process; the clients are the openai SDK; the
upstream (and the extraction model) is the recording fake on loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from extraction.prompts import MARKER
from tests.fake_upstream import Recorded, Reply, completion
from tests.servers import free_port

MEMRELAY = str(Path(sys.executable).with_name("memrelay"))


class Replica:
    """A `memrelay serve` process on a free loopback port."""

    def __init__(self, db: str, upstream: str, **settings: Any) -> None:
        self.port = free_port()
        env = dict(os.environ)
        env.update(
            MEMRELAY_DB=db,
            MEMRELAY_UPSTREAM_URL=upstream,
            MEMRELAY_PORT=str(self.port),
            MEMRELAY_RECALL_MIN_SIMILARITY="-1",
            MEMRELAY_LOG_LEVEL="warning",
        )
        env.update({f"MEMRELAY_{k.upper()}": str(v) for k, v in settings.items()})
        # Its log goes to a file: an unread pipe fills up and blocks the server.
        self.log = tempfile.NamedTemporaryFile(prefix="memrelay-replica-", suffix=".log")
        self.process = subprocess.Popen(
            [MEMRELAY, "serve"], env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"replica exited: {Path(self.log.name).read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/memrelay/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("replica did not become ready")

    def client(self, tenant: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.url + "/v1",
            api_key="sk-test",
            default_headers={"X-Memrelay-Tenant": tenant},
            max_retries=0,
        )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


class OneFactPerExchange:
    """The extraction 'model': exchange `#N` yields the fact `Parcel N is in locker L`,
    a little slowly, so that jobs are still leased when a replica dies."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls = Counter()
        self.lock = threading.Lock()

    def __call__(self, request: Recorded) -> Reply | None:
        if request.path != "/v1/chat/completions" or MARKER.encode() not in request.body:
            return None
        body = request.json()
        payload = json.loads(body["messages"][1]["content"])
        if "user" not in payload:  # reconciliation asks whether two parcels' facts relate
            reply = Reply.json(completion(json.dumps({"relation": "unrelated"})))
            reply.first_delay = self.delay
            return reply
        user = payload["user"]
        number = int(user.split(":")[0].lstrip("#"))
        with self.lock:
            self.calls[number] += 1
        fact = {
            "content": f"Parcel {number} is in locker L{number * 7 % 1000:03d}",
            "kind": "fact",
            "subject": f"parcel {number}",
            "attribute": "locker",
            "value": f"L{number * 7 % 1000:03d}",
            "confidence": 0.9,
            "stated_by": "user",
        }
        reply = Reply.json(completion(json.dumps({"facts": [fact], "forget": []})))
        reply.first_delay = self.delay  # awaited by the fake, not blocking its loop
        return reply


@pytest.fixture
def database(pg_server: Any) -> str:
    url = pg_server.new_database("replicas")
    migrated = subprocess.run(
        [MEMRELAY, "migrate", "--db", url, "--json"], capture_output=True, text=True, timeout=120
    )
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout)["schema_version"] >= 1
    return url


@pytest.fixture
def replicas(database: str, fake_url: str) -> Iterator[Any]:
    started: list[Replica] = []

    def start(**settings: Any) -> Replica:
        replica = Replica(database, fake_url, **settings)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.stop()


def test_remembered_through_one_replica_recalled_through_the_other(fake, replicas):
    a, b = replicas(extraction_workers=0), replicas(extraction_workers=0)
    added = httpx.post(
        a.url + "/memrelay/v1/memories",
        headers={"X-Memrelay-Tenant": "acme"},
        json={"content": "Never deploy on Fridays", "kind": "constraint"},
    )
    assert added.status_code == 201, added.text

    async def ask() -> None:
        reply = await b.client("acme").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Can I deploy the release today?"}]
        )
        assert reply.choices[0].message.content

    asyncio.run(ask())
    system = fake.chat_requests()[-1].json()["messages"][0]
    assert system["role"] == "system" and "Never deploy on Fridays" in system["content"]
    # ... and another tenant asking through either replica sees nothing of it.
    asyncio.run(
        b.client("other").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Can I deploy today?"}]
        )
    )
    assert "Never deploy" not in json.dumps(fake.chat_requests()[-1].json())


def third_process_on_a_busy_port_leaves_every_lease_alone(
    conn: Any, a: Replica, b: Replica, database: str, upstream: str
) -> None:
    """A third `memrelay serve` started mid-run on A's (busy) port fails before it
    touches the queue: the leases A and B hold are exactly as they were. A and B are
    frozen meanwhile, so that nothing else moves a lease."""

    def leases() -> list[tuple[str, str, int]]:
        return conn.execute(
            "SELECT id, lease_owner, attempts FROM jobs WHERE status = 'leased' ORDER BY id"
        ).fetchall()

    env = dict(os.environ)
    env.update(MEMRELAY_DB=database, MEMRELAY_UPSTREAM_URL=upstream, MEMRELAY_PORT=str(a.port))
    env["MEMRELAY_EXTRACTION_WORKERS"] = "3"
    for replica in (a, b):
        replica.process.send_signal(signal.SIGSTOP)
    try:
        before = leases()
        third = subprocess.run(
            [MEMRELAY, "serve"], env=env, capture_output=True, text=True, timeout=120
        )
        after = leases()
    finally:
        for replica in (a, b):
            replica.process.send_signal(signal.SIGCONT)
    assert before, "no lease was held when the third process started"
    assert after == before
    assert third.returncode != 0 and "cannot listen" in third.stdout + third.stderr


@pytest.mark.slow
def test_thousand_exchanges_extracted_exactly_once_with_a_replica_killed(
    fake, replicas, database, fake_url
):
    extraction = OneFactPerExchange(delay=0.3)  # slow while the exchanges are sent
    fake.responder = extraction
    # Heartbeats keep leases while jobs run; the lease only bounds how soon a dead
    # replica's jobs are taken over.
    settings = {"extraction_workers": 3, "extraction_lease_seconds": 8}
    a, b = replicas(**settings), replicas(**settings)
    tenants = [f"team{i}" for i in range(8)]

    async def drive() -> None:
        clients = {(r.url, t): r.client(t) for r in (a, b) for t in tenants}
        gate = asyncio.Semaphore(16)

        async def one(n: int) -> None:
            replica = (a, b)[n % 2]
            async with gate:
                reply = await clients[(replica.url, tenants[n % 8])].chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": f"#{n}: where is my parcel?"}],
                    stream=n % 3 == 0,
                )
                if n % 3 == 0:
                    async for _chunk in reply:
                        pass

        await asyncio.gather(*(one(n) for n in range(1000)))

    asyncio.run(drive())
    with psycopg.connect(database, autocommit=True) as conn:

        def counts() -> dict[str, int]:
            rows = conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall()
            return dict(rows)

        deadline = time.monotonic() + 60
        while sum(counts().values()) < 1000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sum(counts().values()) == 1000  # every exchange was queued
        third_process_on_a_busy_port_leaves_every_lease_alone(conn, a, b, database, fake_url)
        extraction.delay = 0.03
        # Kill replica A while its workers hold leases and work is left for B. Lease
        # owners name host and pid, so A's leases can be told from B's.
        owned_by_a = f"%:{a.process.pid}:%"
        deadline = time.monotonic() + 60
        held: list[tuple[str]] = []
        while not held and time.monotonic() < deadline:
            a.process.send_signal(signal.SIGSTOP)  # freeze A to read its leases
            held = conn.execute(
                "SELECT id FROM jobs WHERE status = 'leased' AND lease_owner LIKE %s",
                (owned_by_a,),
            ).fetchall()
            if not held:
                a.process.send_signal(signal.SIGCONT)
                time.sleep(0.01)
        leased_by_a = {job_id for (job_id,) in held}
        a.kill()
        assert leased_by_a, "replica A held no lease when it died"
        assert counts().get("done", 0) < 1000, "the run was over before the kill"
        deadline = time.monotonic() + 240
        while counts().get("done", 0) < 1000 and time.monotonic() < deadline:
            time.sleep(0.2)
        errors = conn.execute(
            "SELECT last_error, count(*) FROM jobs WHERE last_error IS NOT NULL GROUP BY 1"
        ).fetchall()
        assert counts() == {"done": 1000}, errors
        contents = [
            row[0]
            for row in conn.execute(
                "SELECT content FROM memories WHERE status = 'active'"
            ).fetchall()
        ]
        assert len(contents) == 1000 and len(set(contents)) == 1000  # none lost, no copies
        expected = {f"Parcel {n} is in locker L{n * 7 % 1000:03d}" for n in range(1000)}
        assert set(contents) == expected
        per_tenant = conn.execute(
            "SELECT tenant, count(*) FROM memories GROUP BY tenant ORDER BY tenant"
        ).fetchall()
        assert per_tenant == [(t, 125) for t in tenants]
        wrong = conn.execute(
            "SELECT count(*) FROM memories WHERE"
            " 'team' || ((split_part(content, ' ', 2))::int % 8) != tenant"
        ).fetchone()[0]
        assert wrong == 0
        # Jobs A held when it died were finished by B (after their leases ran out).
        finished = conn.execute(
            "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = 'done' AND attempts = 2",
            (list(leased_by_a),),
        ).fetchone()[0]
        assert finished == len(leased_by_a)
        # A job run twice (its lease ran out mid-way) reinforced instead of adding again.
        retried = [n for n, calls in extraction.calls.items() if calls > 1]
        events = dict(conn.execute("SELECT action, count(*) FROM events GROUP BY action"))
        assert events["added"] == 1000
        assert events.get("reinforced", 0) <= len(retried)
