"""The MCP server over streamable HTTP (/memrelay/mcp), driven by the official SDK's own
client session against memrelay served on a loopback port, in both protocol eras: the
2025 initialize handshake and the 2026-07-28 per-request protocol (server/discover).

Who a call is comes from the edge (key, tenant, spaces, memory mode), never from a tool
argument: a key bound to alice can never recall, list, correct, forget or read the
history of bob's memories through any tool, and a missing or wrong key is refused.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from memory_core import NewMemory, SQLiteStore
from proxy.admin.mcp_http import MCP_PATH, MCPEndpoint
from proxy.app import create_app
from proxy.edge.keys import KeyStore
from proxy.settings import Settings
from proxy.wiring import build_app
from tests.mcp_helpers import TOOLS, data, error_text, everything, http_session
from tests.servers import ServedApp
from tests.text_checks import without_generated_ids

ERAS = ["legacy", "modern"]
BOB_SECRETS = [
    ("default", "SECRET-bob-1: bob's door code is 4711"),
    ("default", "SECRET-bob-2: bob prefers his salary paid in francs"),
    ("work", "SECRET-bob-3: bob's launch date is March 3"),
]
ALICE_TEAM = "alice's team deploys on Fridays"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "0"},
    },
}
JSON_ACCEPT = {"Accept": "application/json, text/event-stream"}


@dataclass
class World:
    url: str
    alice: str
    bob: str
    bob_ids: list[str]
    team_id: str

    def headers(
        self, key: str | None = None, tenant: str = "alice", **extra: str
    ) -> dict[str, str]:
        found = {"X-Memrelay-Tenant": tenant, **extra}
        found["X-Memrelay-Key"] = self.alice if key is None else key
        return found


def _seed(path: Path, embedder: Any) -> tuple[list[str], str]:
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(SQLiteStore.open(path, embedder))
    try:
        bob = [
            loop.run_until_complete(store.add("bob", space, NewMemory(text))).id
            for space, text in BOB_SECRETS
        ]
        team = loop.run_until_complete(store.add("alice", "team", NewMemory(ALICE_TEAM))).id
    finally:
        loop.run_until_complete(store.close())
        loop.close()
    return bob, team


@pytest.fixture(scope="module")
def world(tmp_path_factory: Any, embedder: Any, served_fake: Any) -> Any:
    tmp = tmp_path_factory.mktemp("mcp-http")
    keys = KeyStore(tmp / "keys.json")
    alice, _ = keys.create(["alice"])
    bob, _ = keys.create(["bob"])
    bob_ids, team_id = _seed(tmp / "memory.db", embedder)
    settings = Settings(
        upstream_url=served_fake[1].url,
        db=tmp / "memory.db",
        keys_file=tmp / "keys.json",
        extraction_workers=0,
    )
    with ServedApp(build_app(settings, store=SQLiteStore(settings.db, embedder))) as served:
        yield World(served.url, alice, bob, bob_ids, team_id)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("era", ERAS)
def test_the_six_tools_take_no_tenant_and_refuse_one(world: World, era: str) -> None:
    async def probe() -> None:
        async with http_session(world.url, world.headers(), era) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert set(tools) == TOOLS
            for name, tool in tools.items():
                params = set(tool.input_schema["properties"])
                assert not params & {"tenant", "tenant_id", "read_spaces", "write_space"}, name
                assert "space" not in params or name == "list", name
            assert tools["recall"].annotations.read_only_hint  # type: ignore[union-attr]
            assert tools["forget"].annotations.destructive_hint  # type: ignore[union-attr]
            # An agent that tries to choose is told it cannot, and gets nothing of bob's.
            for args in ({"tenant": "bob"}, {"space": "work"}, {"read_spaces": "default"}):
                result = await session.call_tool("recall", {"query": "door code", **args})
                assert "come from this connection" in error_text(result)
                assert "SECRET-bob" not in everything(result)
            result = await session.call_tool("remember", {"content": "x y z", "tenant": "bob"})
            assert result.is_error

    run(probe())


@pytest.mark.parametrize("era", ERAS)
def test_remember_recall_correct_history_forget(world: World, era: str) -> None:
    space = f"life-{era}"
    headers = world.headers(**{"X-Memrelay-Write-Space": space})

    async def lifecycle() -> None:
        async with http_session(world.url, headers, era) as session:
            added = data(
                await session.call_tool(
                    "remember",
                    {
                        "content": "The user's favourite editor is Helix",
                        "kind": "preference",
                        "subject": "user",
                        "attribute": "editor",
                        "value": "Helix",
                    },
                )
            )
            memory = added["memory"]
            assert added["action"] == "added"
            assert (memory["tenant"], memory["space"], memory["source"]) == ("alice", space, "user")
            provenance = memory["provenance"][0]
            assert provenance["via"] == "mcp-http" and provenance["key_id"].startswith("key_")
            again = data(
                await session.call_tool(
                    "remember", {"content": "The user's favourite editor is Helix"}
                )
            )
            assert again["action"] == "reinforced" and again["memory"]["id"] == memory["id"]

            found = data(await session.call_tool("recall", {"query": "which editor"}))["data"]
            assert found[0]["memory"]["id"] == memory["id"]
            assert {"vector_similarity", "score"} <= set(found[0]["breakdown"])

            corrected = data(
                await session.call_tool(
                    "correct",
                    {
                        "memory_id": memory["id"],
                        "content": "The user's favourite editor is Zed",
                        "value": "Zed",
                    },
                )
            )
            new = corrected["memory"]
            assert corrected["superseded"]["status"] == "superseded"
            assert corrected["superseded"]["superseded_by"] == new["id"]
            assert (new["space"], new["kind"], new["attribute"]) == (space, "preference", "editor")
            found = data(await session.call_tool("recall", {"query": "favourite editor"}))["data"]
            assert [r["memory"]["content"] for r in found] == ["The user's favourite editor is Zed"]
            again = await session.call_tool("correct", {"memory_id": memory["id"], "content": "x"})
            assert "superseded" in error_text(again)  # only an active memory is corrected

            events = data(await session.call_tool("history", {"memory_id": memory["id"]}))
            actions = [e["action"] for e in events["data"]]
            assert actions[0] == "added" and "superseded" in actions
            assert events["memory"]["status"] == "superseded"

            dry = data(await session.call_tool("forget", {"memory_id": new["id"]}))
            assert dry == {
                "dry_run": True,
                "would_forget": [{"id": new["id"], "content": new["content"], "space": space}],
            }
            listed = data(await session.call_tool("list", {}))["data"]
            assert [m["id"] for m in listed] == [new["id"]]  # a dry run changes nothing
            gone = data(
                await session.call_tool("forget", {"memory_id": new["id"], "dry_run": False})
            )
            assert gone["forgotten"][0]["id"] == new["id"]
            assert data(await session.call_tool("list", {}))["data"] == []
            tombstones = data(await session.call_tool("list", {"status": ["forgotten"]}))["data"]
            assert {m["id"] for m in tombstones} == {new["id"], memory["id"]}  # both versions
            assert all(m["content"] is None for m in tombstones)
            assert (
                data(await session.call_tool("recall", {"query": "favourite editor"}))["data"] == []
            )

            data(await session.call_tool("remember", {"content": "The user's cat is named Miso"}))
            by_query = {"query": "the name of the user's cat", "min_similarity": 0.3}
            dry = data(await session.call_tool("forget", by_query))
            assert [m["content"] for m in dry["would_forget"]] == ["The user's cat is named Miso"]
            done = data(await session.call_tool("forget", {**by_query, "dry_run": False}))
            assert len(done["forgotten"]) == 1
            assert data(await session.call_tool("list", {}))["data"] == []
            both = await session.call_tool("forget", {"memory_id": "mem_x", "query": "cat"})
            assert "exactly one" in error_text(both)

    run(lifecycle())


def _bob_fine(world: World) -> None:
    """Bob's memories, read with bob's own key, are all still there, untouched."""

    async def check() -> None:
        async with http_session(world.url, world.headers(world.bob, "bob", **READS)) as session:
            listed = data(await session.call_tool("list", {}))["data"]
            assert sorted(m["id"] for m in listed) == sorted(world.bob_ids)
            assert {m["content"] for m in listed} == {text for _, text in BOB_SECRETS}
            for memory_id in world.bob_ids:
                events = data(await session.call_tool("history", {"memory_id": memory_id}))
                assert [e["action"] for e in events["data"]] == ["added"]

    run(check())


READS = {"X-Memrelay-Read-Spaces": "default,work"}  # bob's spaces, by name


@pytest.mark.parametrize("era", ERAS)
def test_alice_can_never_reach_bobs_memories_through_any_tool(world: World, era: str) -> None:
    async def attack() -> None:
        async with http_session(world.url, world.headers(**READS), era) as session:
            seen: list[str] = []
            for query in ("door code", "salary francs", "launch date", "SECRET-bob"):
                result = await session.call_tool("recall", {"query": query, "top_k": 100})
                seen.append(everything(result))
                assert all(r["memory"]["tenant"] == "alice" for r in data(result)["data"])
            everything_listed = await session.call_tool(
                "list", {"status": ["active", "superseded", "forgotten", "expired"]}
            )
            seen.append(everything(everything_listed))
            calls: list[tuple[str, dict[str, Any]]] = [
                ("history", {}),
                ("correct", {"content": "bob owes alice money"}),
                ("forget", {}),
                ("forget", {"dry_run": False}),
            ]
            for name, args in calls:
                nowhere = await session.call_tool(name, {**args, "memory_id": "mem_nope"})
                for memory_id in world.bob_ids:
                    result = await session.call_tool(name, {**args, "memory_id": memory_id})
                    # The same answer as for an id that exists nowhere: no oracle.
                    expected = error_text(nowhere).replace("mem_nope", memory_id)
                    assert error_text(result) == expected
                    seen.append(everything(result))
            for query in ("bob's door code", "salary", "launch date"):
                result = await session.call_tool(
                    "forget", {"query": query, "dry_run": False, "min_similarity": -1}
                )
                assert all("SECRET-bob" not in m["content"] for m in data(result)["forgotten"])
                seen.append(everything(result))
            assert not any(
                "SECRET-bob" in text or "4711" in without_generated_ids(text) for text in seen
            )

    run(attack())
    _bob_fine(world)
    metrics = httpx.get(world.url + "/metrics", headers=world.headers()).text
    assert 'memrelay_requests_total{method="POST",route="mcp",status="200"}' in metrics


def test_a_key_is_refused_for_a_tenant_it_is_not_bound_to(world: World) -> None:
    for headers, status in (
        (world.headers(tenant="bob"), 403),  # alice's key, bob's tenant
        ({"X-Memrelay-Tenant": "alice"}, 401),  # no key
        (world.headers(key="mr_not-a-key"), 401),
        (world.headers(key=world.bob), 403),  # bob's key, alice's tenant
        ({"X-Memrelay-Key": world.alice}, 403),  # the default tenant is not alice's
        ({"Authorization": f"Bearer {world.bob}", "X-Memrelay-Tenant": "alice"}, 403),
    ):
        raw = httpx.post(
            world.url + MCP_PATH, json=INITIALIZE, headers={**headers, **JSON_ACCEPT}, timeout=30
        )
        assert raw.status_code == status, (headers.keys(), raw.text)
        assert raw.json()["error"]["type"] in ("authentication_error", "permission_error")
        assert "SECRET-bob" not in raw.text

        async def sdk(headers: dict[str, str] = headers) -> None:
            async with http_session(world.url, headers) as session:
                await session.call_tool("recall", {"query": "door code"})

        with pytest.raises((MCPError, ExceptionGroup)):
            run(sdk())
    # A Bearer key is memrelay's own here (memrelay routes never reach the upstream).
    bearer = {"Authorization": f"Bearer {world.alice}", "X-Memrelay-Tenant": "alice"}
    ok = httpx.post(world.url + MCP_PATH, json=INITIALIZE, headers={**bearer, **JSON_ACCEPT})
    assert ok.status_code == 200 and ok.json()["result"]["serverInfo"]["name"] == "memrelay"
    _bob_fine(world)


def test_spaces_come_from_the_headers(world: World) -> None:
    async def probe() -> None:
        async with http_session(world.url, world.headers()) as session:  # reads "default"
            outside = await session.call_tool("list", {"space": ["team"]})
            assert "not among this connection's read spaces" in error_text(outside)
            hidden = await session.call_tool("history", {"memory_id": world.team_id})
            assert "no memory" in error_text(hidden)
        team = world.headers(**{"X-Memrelay-Read-Spaces": "default,team"})
        async with http_session(world.url, team) as session:  # writes "default"
            listed = data(await session.call_tool("list", {"space": ["team"]}))["data"]
            assert [m["id"] for m in listed] == [world.team_id]
            refused = await session.call_tool(
                "correct", {"memory_id": world.team_id, "content": "alice's team never deploys"}
            )
            assert "no memory" in error_text(refused)  # corrections land in the write space
            dry = data(await session.call_tool("forget", {"memory_id": world.team_id}))
            assert dry["would_forget"][0]["content"] == ALICE_TEAM
        async with http_session(world.url, team) as session:
            listed = data(await session.call_tool("list", {"space": ["team"]}))["data"]
            assert [m["content"] for m in listed] == [ALICE_TEAM]

    run(probe())


@pytest.mark.parametrize(
    ("mode", "may_read", "may_write"),
    [("read", True, False), ("write", False, True), ("off", False, False)],
)
def test_the_memory_mode_header_limits_the_tools(
    world: World, mode: str, may_read: bool, may_write: bool
) -> None:
    headers = world.headers(**{"X-Memrelay-Memory": mode, "X-Memrelay-Write-Space": "modes"})

    async def probe() -> None:
        async with http_session(world.url, headers) as session:
            recall = await session.call_tool("recall", {"query": "anything"})
            listed = await session.call_tool("list", {})
            dry = await session.call_tool("forget", {"query": "anything"})
            for result in (recall, listed, dry):
                assert result.is_error != may_read
            remember = await session.call_tool("remember", {"content": f"mode {mode} was here"})
            assert remember.is_error != may_write
            if not may_write:
                assert f"memory mode is {mode!r}" in error_text(remember)

    run(probe())


def _open_world(tmp: Path, embedder: Any, fake_url: str) -> tuple[MCPEndpoint, Any]:
    settings = Settings(upstream_url=fake_url, db=tmp / "open.db", extraction_workers=0)
    store = SQLiteStore(settings.db, embedder)
    from extraction.reconcile import Reconciler

    endpoint = MCPEndpoint(store, Reconciler(store, None, actor="mcp"), settings)
    app = create_app(settings, routes=[endpoint.route()], resources=[store, endpoint])
    return endpoint, app


def test_without_keys_only_loopback_hosts_and_origins_reach_the_tools(
    tmp_path: Path, embedder: Any, fake_url: str
) -> None:
    """Open memrelay serves loopback only; a web page must not reach it by DNS rebinding."""
    _, app = _open_world(tmp_path, embedder, fake_url)
    with ServedApp(app) as served:
        url = served.url + MCP_PATH
        for extra, status in (
            ({}, 200),
            ({"Origin": f"http://127.0.0.1:{served.port}"}, 200),
            ({"Host": "evil.example"}, 421),
            ({"Host": f"evil.example:{served.port}"}, 421),
            ({"Origin": "http://evil.example"}, 403),
        ):
            raw = httpx.post(url, json=INITIALIZE, headers={**JSON_ACCEPT, **extra})
            assert raw.status_code == status, (extra, raw.text)


def test_the_session_manager_starts_and_stops_with_the_app(
    tmp_path: Path, embedder: Any, fake_url: str
) -> None:
    """Driven through the app's own ASGI lifespan, on one event loop: the MCP session
    manager answers only between startup and shutdown."""
    endpoint, app = _open_world(tmp_path, embedder, fake_url)
    body = json.dumps(INITIALIZE).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": MCP_PATH,
        "headers": [
            (b"host", b"127.0.0.1:8421"),
            (b"content-type", b"application/json"),
            (b"accept", b"application/json"),
        ],
    }

    async def initialize() -> int:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await endpoint.manager.handle_request(scope, receive, send)
        return int(sent[0]["status"])

    async def lifespan() -> None:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        said: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        running = asyncio.create_task(
            app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, said.put)
        )
        with pytest.raises(RuntimeError, match="Task group is not initialized"):
            await initialize()  # not before startup
        await inbox.put({"type": "lifespan.startup"})
        assert (await said.get())["type"] == "lifespan.startup.complete"
        assert await initialize() == 200
        await inbox.put({"type": "lifespan.shutdown"})
        assert (await said.get())["type"] == "lifespan.shutdown.complete"
        await running
        with pytest.raises(RuntimeError, match="Task group is not initialized"):
            await initialize()  # nor after shutdown

    run(lifespan())


def test_a_call_without_the_edges_decision_has_no_identity() -> None:
    """Never a default tenant: no HTTP request, or one the edge never saw, is refused."""
    from types import SimpleNamespace

    from starlette.requests import Request

    from proxy.admin.mcp_server import http_caller
    from proxy.edge.identity import IdentityMissing

    def ctx(request: Any) -> Any:
        return SimpleNamespace(request_context=SimpleNamespace(request=request))

    with pytest.raises(IdentityMissing):
        http_caller(ctx(None))
    unseen = Request({"type": "http", "method": "POST", "path": MCP_PATH, "headers": []})
    with pytest.raises(IdentityMissing):
        http_caller(ctx(unseen))


def test_building_the_server_leaves_the_processs_logging_alone(tmp_path: Path) -> None:
    """The SDK's MCPServer() would configure the root logger of a process that has not."""
    probe = (
        "import logging\n"
        "from proxy.admin.mcp_server import build_server, fixed_caller\n"
        "from proxy.memory.scoping import MemoryScope\n"
        "build_server(None, None, fixed_caller(MemoryScope('t', 's', ('s',), 'on')))\n"
        "root = logging.getLogger()\n"
        "print(len(root.handlers), logging.getLevelName(root.level))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["0", "WARNING"], out.stderr
