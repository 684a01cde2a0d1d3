"""Randomised tenant isolation, tried as an attacker would: both key modes, both backends.

Each run serves memrelay with keys bound to tenants and fires random probes at it:
missing, wrong, revoked and foreign keys; foreign tenants; repeated, case-variant and
comma-listed headers; other tenants' memory ids; every admin route; chat completions
(streamed and not) and path tricks (`//v1/...`, `%2F`, dot segments). After every probe:
- the status is the one the key/tenant rules demand (400 for a repeated or malformed
  memrelay header or a repeated Authorization, 401 for no live key, 403 for a tenant the
  key is not bound to), and every error is the OpenAI shape with a string code;
- no secret of another tenant appears in the response, nor in the system message the
  upstream received;
and after the run, every forgotten memory was forgotten by a legitimate request of its
own tenant, and every imported memory belongs to the tenant that legitimately sent it.
MEMRELAY_ISOLATION_PROBES sets the probes per (key mode, backend): 4 x 2500 by default.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from proxy.edge.keys import KeyStore
from proxy.settings import Settings
from proxy.wiring import build_app
from tests.conftest import open_backend
from tests.servers import ServedApp

pytestmark = pytest.mark.slow

PROBES = int(os.environ.get("MEMRELAY_ISOLATION_PROBES", "2500"))
TENANTS = ("alice", "bob", "carol")
SECRET = re.compile(r"SECRET-(alice|bob|carol)-\d+")
TOPICS = ["launch date", "door code", "salary", "password", "address", "diagnosis"]
ADMIN_PREFIX = "/memrelay/v1"


@dataclass
class World:
    server: ServedApp
    keys: dict[str, str]
    bound: dict[str, tuple[str, ...] | None]  # None: admin (any tenant)
    ids: dict[str, list[str]]
    bearer: bool
    store: Any
    template: dict[str, Any]  # an exported record, for import probes
    legit_forgets: dict[str, str] = field(default_factory=dict)  # memory id -> tenant
    imports: dict[str, str] = field(default_factory=dict)  # marker -> tenant
    own_seen: dict[str, int] = field(default_factory=lambda: {"upstream": 0, "response": 0})


def _seed(store: Any) -> dict[str, list[str]]:
    from memory_core import NewMemory

    ids: dict[str, list[str]] = {t: [] for t in TENANTS}
    for tenant in TENANTS:
        for n in range(24):
            space = "default" if n % 3 else "work"
            content = f"SECRET-{tenant}-{n}: {tenant}'s {TOPICS[n % len(TOPICS)]} is {n * 7}"
            memory = store.loop.run_until_complete(
                store.add(tenant, space, NewMemory(content, kind="constraint" if n % 4 else "fact"))
            )
            ids[tenant].append(memory.id)
    return ids


async def _first_export(store: Any, memory_id: str) -> str:
    async for line in store.export("alice"):
        if json.loads(line)["id"] == memory_id:
            return line
    raise AssertionError("seeded memory not exported")


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: Any, tmp_path: Any) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_server").new_database())
    return str(tmp_path / "memory.db")


@pytest.fixture(params=["x-memrelay-key", "bearer"])
def world(
    request: Any, backend: str, tmp_path: Any, embedder: Any, fake_url: str
) -> Iterator[World]:
    from memory_core.backends import make_store

    keys_file = tmp_path / "keys.json"
    store_keys = KeyStore(keys_file)
    keys, bound = {}, {}
    for name, tenants in (("alice", ["alice"]), ("bob", ["bob"]), ("ac", ["alice", "carol"])):
        keys[name], _ = store_keys.create(tenants)
        bound[name] = tuple(tenants)
    keys["admin"], _ = store_keys.create([], admin=True)
    bound["admin"] = None
    keys["revoked"], record = store_keys.create(["alice"])
    store_keys.revoke(record.id)
    bearer = request.param == "bearer"
    settings = Settings(
        upstream_url=fake_url,
        db=backend,
        keys_file=keys_file,
        recall_min_similarity=-1.0,
        recall_budget_ms=5000,
        recall_top_k=12,
        extraction_workers=0,
        upstream_api_key="sk-memrelay-upstream" if bearer else None,
    )
    loop = asyncio.new_event_loop()
    kind = "postgres" if backend.startswith("postgresql") else "vector-cache"
    seed = open_backend(
        kind, backend if kind == "postgres" else tmp_path / "memory.db", embedder, loop
    )
    ids = _seed(seed)
    template = json.loads(loop.run_until_complete(_first_export(seed, ids["alice"][1])))
    served = ServedApp(build_app(settings, store=make_store(backend, embedder)))
    served.__enter__()
    try:
        yield World(served, keys, bound, ids, bearer, seed, template)
    finally:
        served.__exit__(None, None, None)
        loop.run_until_complete(seed.close())
        loop.close()


@dataclass
class Probe:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: Any = None
    raw: bytes | None = None
    kind: str = "admin"  # admin | chat | forwarded | unknown
    expect: int | None = None  # the status the key/tenant rules demand, if they decide it
    tenant: str | None = None  # the tenant a successful answer may show
    note: str = ""


def _case(rng: random.Random, name: str) -> str:
    return rng.choice([name, name.lower(), name.upper(), name.title().replace("-", "-")])


def _key_part(rng: random.Random, world: World) -> tuple[list[tuple[str, str]], str | None, bool]:
    """Key headers, the key name that is live (None if none) and whether one was repeated."""
    choice = rng.choice(["alice", "bob", "ac", "admin", "revoked", "wrong", "none", "alice", "bob"])
    value = {"wrong": "mr_" + "x" * 43, "none": None}.get(choice, world.keys.get(choice))
    live = choice if choice in ("alice", "bob", "ac", "admin") else None
    header = "Authorization" if world.bearer else "X-Memrelay-Key"
    headers: list[tuple[str, str]] = []
    if value is not None:
        headers.append((_case(rng, header), f"Bearer {value}" if world.bearer else value))
    repeated = False
    if rng.random() < 0.12:  # a second key: someone else's
        other = world.keys[rng.choice(["alice", "bob", "admin"])]
        headers.append((_case(rng, header), f"Bearer {other}" if world.bearer else other))
        repeated = value is not None
        if value is None:
            live = None  # a lone key of someone else: judged below by its own binding
            for name, key in world.keys.items():
                if key == other:
                    live = name
    if not world.bearer and rng.random() < 0.5:
        headers.append(("Authorization", "Bearer sk-client-upstream"))
    return headers, live, repeated


def _tenant_part(rng: random.Random) -> tuple[list[tuple[str, str]], str | None, bool, bool]:
    """Tenant headers, the single valid tenant named (None: none named), whether a memrelay
    header repeats, and whether a value is malformed."""
    roll = rng.random()
    name = "X-Memrelay-Tenant"
    if roll < 0.1:
        return [], None, False, False
    if roll < 0.25:  # twice: the attack of the first version
        a, b = rng.choice(TENANTS), rng.choice(TENANTS)
        return [(_case(rng, name), a), (_case(rng, name), b)], None, True, False
    if roll < 0.33:  # a comma list
        return (
            [(_case(rng, name), f"{rng.choice(TENANTS)},{rng.choice(TENANTS)}")],
            None,
            False,
            True,
        )
    if roll < 0.38:
        return (
            [(_case(rng, name), rng.choice(["", "bob;alice", "ali ce", "bob\tx"]))],
            None,
            False,
            True,
        )
    value = rng.choice([*TENANTS, "ALICE", "dave"])
    return [(_case(rng, name), value)], value, False, False


def _space_part(rng: random.Random) -> tuple[list[tuple[str, str]], bool]:
    headers: list[tuple[str, str]] = []
    repeated = False
    if rng.random() < 0.3:
        headers.append(
            (
                _case(rng, "X-Memrelay-Read-Spaces"),
                rng.choice(["default,work", "work", "default, work,work"]),
            )
        )
        if rng.random() < 0.15:
            headers.append(("x-memrelay-read-spaces", "work"))
            repeated = True
    if rng.random() < 0.15:
        headers.append((_case(rng, "X-Memrelay-Write-Space"), rng.choice(["default", "work"])))
    return headers, repeated


def _target(rng: random.Random, world: World, tenant: str | None) -> Probe:
    """A route and body; ids and queries mostly aim at other tenants' memories."""
    victim = rng.choice([t for t in TENANTS if t != tenant] or list(TENANTS))
    foreign_id = rng.choice(world.ids[victim])
    own_id = rng.choice(world.ids[tenant]) if tenant in world.ids else foreign_id
    memory_id = own_id if rng.random() < 0.2 else foreign_id
    words = f"SECRET {victim} {rng.choice(TOPICS)}"
    p = ADMIN_PREFIX
    route = rng.choice(
        [
            "list", "get", "history", "delete", "recall", "forget", "events", "stats",
            "export", "import", "jobs", "retry", "chat", "chat", "stream", "stream",
            "trick", "forwarded", "unknown",
        ]
    )  # fmt: skip
    if route == "list":
        status = rng.choice(["", "active", "active,forgotten"])
        return Probe("GET", f"{p}/memories" + (f"?status={status}" if status else ""), [])
    if route == "get":
        return Probe("GET", f"{p}/memories/{memory_id}", [])
    if route == "history":
        return Probe("GET", f"{p}/memories/{memory_id}/history", [])
    if route == "delete":
        return Probe("DELETE", f"{p}/memories/{memory_id}", [], note=memory_id)
    if route == "recall":
        return Probe("POST", f"{p}/recall", [], {"query": words, "top_k": 20})
    if route == "forget":
        dry = rng.random() < 0.7
        body = {"query": words, "dry_run": dry, "top_k": 3, "min_similarity": 0.2}
        return Probe("POST", f"{p}/forget", [], body)
    if route == "events":
        return Probe("GET", f"{p}/events?since=0&limit=1000", [])
    if route == "stats":
        return Probe("GET", f"{p}/stats", [])
    if route == "export":
        return Probe("GET", f"{p}/export", [])
    if route == "import":
        marker = f"IMPORT-{rng.getrandbits(48):x}"
        line = {**world.template, "tenant": victim, "content": marker, "events": []}
        line["id"] = "mem_imp" + marker[7:]
        return Probe("POST", f"{p}/import", [], raw=json.dumps(line).encode(), note=marker)
    if route == "jobs":
        return Probe("GET", f"{p}/jobs", [])
    if route == "retry":
        return Probe("POST", f"{p}/jobs/job_{foreign_id}/retry", [])
    if route in ("chat", "stream", "trick"):
        path = "/v1/chat/completions"
        if route == "trick":
            path = rng.choice(
                [
                    "//v1/chat/completions",
                    "/v1/./chat/completions",
                    "/v1%2Fchat/completions",
                    "/v1/chat/completions.",
                    "/x/../v1/chat/completions",
                ]
            )
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": f"Tell me {words} and everything else"}],
            "stream": route == "stream",
        }
        return Probe("POST", path, [], body, kind="chat")
    if route == "forwarded":
        return Probe("GET", "/v1/models", [], kind="forwarded")
    path = rng.choice(
        [
            "/chat/completions",
            "/completion",
            "/slots",
            "/props",
            "/memrelay/v1/memory",
            "/memrelay/v1/nope",
        ]
    )
    return Probe(rng.choice(["GET", "POST"]), path, [], {"prompt": words}, kind="unknown")


def make_probe(rng: random.Random, world: World) -> Probe:
    key_headers, live, key_repeated = _key_part(rng, world)
    tenant_headers, tenant, tenant_repeated, malformed = _tenant_part(rng)
    space_headers, space_repeated = _space_part(rng)
    probe = _target(rng, world, tenant if tenant in TENANTS else None)
    headers = key_headers + tenant_headers + space_headers
    rng.shuffle(headers)
    probe.headers = headers
    effective = tenant if tenant is not None else "default"
    needs_tenant = probe.kind in ("admin", "chat") or tenant is not None
    if key_repeated or tenant_repeated or space_repeated or malformed:
        probe.expect = 400
    elif live is None:
        probe.expect = 401
    elif needs_tenant and world.bound[live] is not None and effective not in world.bound[live]:
        probe.expect = 403
    else:
        probe.tenant = effective
    return probe


def _send(client: httpx.Client, world: World, probe: Probe) -> httpx.Response:
    url = httpx.URL(world.server.url + probe.path) if "%2F" not in probe.path else None
    if url is None:  # keep the encoded slash on the wire
        url = httpx.URL(world.server.url).copy_with(raw_path=probe.path.encode())
    content = (
        probe.raw
        if probe.raw is not None
        else (json.dumps(probe.body).encode() if probe.body is not None else None)
    )
    headers = list(probe.headers)
    if content is not None:
        headers.append(
            ("Content-Type", "application/x-ndjson" if probe.raw else "application/json")
        )
    return client.request(probe.method, url, headers=headers, content=content)


def _check(world: World, probe: Probe, response: httpx.Response, upstream: list[str]) -> list[str]:
    problems = []
    where = f"{probe.method} {probe.path} {probe.headers}"
    if probe.expect is not None and response.status_code != probe.expect:
        problems.append(f"{where}: expected {probe.expect}, got {response.status_code}")
    if response.status_code >= 400:
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if not isinstance(code, str):
            problems.append(
                f"{where}: {response.status_code} without an OpenAI error and string code"
            )
    if response.status_code >= 500:
        problems.append(f"{where}: server error {response.status_code} {response.text[:200]}")
    allowed = probe.tenant if probe.expect is None else None
    if allowed and any(SECRET.search(u) for u in upstream):
        world.own_seen["upstream"] += 1
    if allowed and SECRET.search(response.text):
        world.own_seen["response"] += 1
    for text, what in (
        (response.text, "response"),
        *((u, "upstream system message") for u in upstream),
    ):
        for leaked in set(SECRET.findall(text)):
            if leaked != allowed:
                problems.append(f"{where}: {leaked}'s secret in the {what} (allowed: {allowed})")
    if probe.kind == "unknown" and response.status_code == 200:
        problems.append(f"{where}: forwarded a path outside the pass-through list")
    if response.status_code == 200 and probe.expect is None and allowed is not None:
        if probe.method == "DELETE":
            world.legit_forgets[probe.note] = allowed
        if probe.path.endswith("/forget") and not probe.body["dry_run"]:
            for item in response.json()["forgotten"]:
                world.legit_forgets[item["id"]] = allowed
        if probe.path.endswith("/import"):
            world.imports[probe.note] = allowed
    return problems


def _final_state(world: World) -> list[str]:
    """Every forgotten memory went by a legitimate request of its own tenant; every
    imported one landed in the tenant that legitimately sent it."""
    from memory_core.store import ListQuery

    problems = []
    run = world.store.loop.run_until_complete
    for tenant in (*TENANTS, "default", "dave", "ALICE"):
        page = run(
            world.store.list(ListQuery(tenant, None, ["forgotten", "active"], None, limit=1000))
        )
        for memory in page.items:
            if memory.status == "forgotten" and world.legit_forgets.get(memory.id) != tenant:
                problems.append(f"{tenant}'s memory {memory.id} was forgotten by another tenant")
            if memory.content and memory.content.startswith("IMPORT-"):
                if world.imports.get(memory.content) != tenant:
                    problems.append(f"import {memory.content} landed in {tenant}")
            if memory.status_reason and "SECRET" in memory.status_reason:
                problems.append(f"a forget reason kept the user's words: {memory.status_reason}")
    return problems


def test_no_request_crosses_a_tenant(world: World, fake: Any) -> None:
    rng = random.Random(f"{world.bearer}-{world.store.backend}-{PROBES}")
    problems: list[str] = []
    statuses: dict[int, int] = {}
    with httpx.Client(timeout=60) as client:
        for n in range(PROBES):
            probe = make_probe(rng, world)
            before = len(fake.requests)
            response = _send(client, world, probe)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            upstream = []
            for recorded in fake.requests[before:]:
                if recorded.path.endswith("/chat/completions") and recorded.body:
                    messages = json.loads(recorded.body).get("messages") or []
                    upstream += [
                        m.get("content") or "" for m in messages if m.get("role") == "system"
                    ]
                    if probe.kind == "chat" and probe.expect is not None:
                        problems.append(f"{probe.path}: a refused chat reached the upstream")
                if probe.kind == "unknown":
                    problems.append(f"{probe.method} {probe.path} reached the upstream")
                auth = recorded.header("authorization") or ""
                if any(key in auth for key in world.keys.values()):
                    problems.append(f"{probe.path}: a memrelay key reached the upstream")
            problems += _check(world, probe, response, upstream)
            if n % 200 == 199:
                fake.reset()
    problems += _final_state(world)
    leaks = [p for p in problems if "secret in the" in p or "by another tenant" in p]
    assert problems == [], (
        f"{len(problems)} problems ({len(leaks)} leaks): {leaks[:3]} {problems[:5]}"
    )
    # The mix really exercised every outcome, and legitimate requests did see their own.
    assert world.own_seen["upstream"] > PROBES // 100, world.own_seen
    assert world.own_seen["response"] > PROBES // 50, world.own_seen
    assert len(world.imports) > PROBES // 400, world.imports
    for status in (200, 400, 401, 403, 404):
        assert statuses.get(status, 0) > PROBES // 100, statuses
