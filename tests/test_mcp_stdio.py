"""`memrelay mcp`: the MCP server over stdio, as a desktop client runs it (a real
subprocess), driven by the official SDK's client session.

The tenant, spaces and memory mode are the command's options: started for alice, no tool
call can recall, list, correct, forget or read the history of bob's memories in the
same database file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from memory_core import NewMemory, SQLiteStore
from proxy.admin.mcp_http import MCP_PATH
from proxy.cli.main import app
from proxy.cli.mcp_stdio import scope_from_options
from proxy.edge.identity import KNOWN, parse_headers
from tests.mcp_helpers import ROOT, TOOLS, data, error_text, everything, stdio_session

BOB = [("default", "SECRET-bob-1: bob's door code is 4711"), ("work", "SECRET-bob-2: bob's pin")]


def _store_do(path: Path, embedder: Any, work: Any) -> Any:
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(SQLiteStore.open(path, embedder))
    try:
        return loop.run_until_complete(work(store))
    finally:
        loop.run_until_complete(store.close())
        loop.close()


@pytest.fixture
def db(tmp_path: Path, embedder: Any) -> tuple[Path, list[str]]:
    path = tmp_path / "memory.db"

    async def seed(store: Any) -> list[str]:
        return [(await store.add("bob", space, NewMemory(text))).id for space, text in BOB]

    return path, _store_do(path, embedder, seed)


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_stdio_tools_for_one_tenant_only(
    db: tuple[Path, list[str]], embedder: Any, era: str
) -> None:
    path, bob_ids = db
    args = ["--db", str(path), "--tenant", "alice", "--spaces", "default,work"]

    async def session_run() -> None:
        async with stdio_session(args, era) as session:
            assert {t.name for t in (await session.list_tools()).tools} == TOOLS
            added = data(
                await session.call_tool("remember", {"content": "The user drinks green tea"})
            )
            memory = added["memory"]
            assert (memory["tenant"], memory["space"]) == ("alice", "default")
            assert memory["provenance"][0]["via"] == "mcp-stdio"
            found = data(await session.call_tool("recall", {"query": "what does the user drink"}))
            assert found["data"][0]["memory"]["id"] == memory["id"]
            assert "vector_similarity" in found["data"][0]["breakdown"]
            new = data(
                await session.call_tool(
                    "correct",
                    {"memory_id": memory["id"], "content": "The user drinks black coffee"},
                )
            )["memory"]
            history = data(await session.call_tool("history", {"memory_id": memory["id"]}))
            assert [e["action"] for e in history["data"]][-1] == "superseded"
            dry = data(await session.call_tool("forget", {"query": "coffee", "min_similarity": 0}))
            assert [m["id"] for m in dry["would_forget"]] == [new["id"]]
            gone = data(
                await session.call_tool("forget", {"memory_id": new["id"], "dry_run": False})
            )
            assert gone["forgotten"][0]["id"] == new["id"]

            # Bob's memories, through every tool: never seen, never changed.
            seen = [
                everything(await session.call_tool("recall", {"query": q, "top_k": 100}))
                for q in ("door code", "pin", "SECRET-bob")
            ]
            seen.append(
                everything(await session.call_tool("list", {"status": ["active", "forgotten"]}))
            )
            for name, extra in (
                ("history", {}),
                ("correct", {"content": "bob owes alice"}),
                ("forget", {"dry_run": False}),
            ):
                nowhere = await session.call_tool(name, {**extra, "memory_id": "mem_nope"})
                for memory_id in bob_ids:
                    result = await session.call_tool(name, {**extra, "memory_id": memory_id})
                    assert error_text(result) == error_text(nowhere).replace("mem_nope", memory_id)
                    seen.append(everything(result))
            wide = {"query": "door code pin", "dry_run": False, "min_similarity": -1}
            seen.append(everything(await session.call_tool("forget", wide)))
            refused = await session.call_tool("list", {"tenant": "bob"})
            assert "come from this connection" in error_text(refused)
            assert not any("SECRET-bob" in text for text in seen)

    asyncio.run(session_run())

    async def bobs(store: Any) -> list[Any]:
        return [await store.get("bob", memory_id) for memory_id in bob_ids]

    kept = _store_do(path, embedder, bobs)
    assert [(m.status, m.content) for m in kept] == [("active", text) for _, text in BOB]


def test_stdio_memory_read_is_read_only(db: tuple[Path, list[str]]) -> None:
    path, _ = db
    args = ["--db", str(path), "--tenant", "bob", "--memory", "read"]

    async def session_run() -> None:
        async with stdio_session(args) as session:
            found = data(await session.call_tool("recall", {"query": "door code"}))
            assert found["data"][0]["memory"]["content"] == BOB[0][1]
            refused = await session.call_tool("remember", {"content": "bob likes jazz"})
            assert "memory mode is 'read'" in error_text(refused)
            memory_id = found["data"][0]["memory"]["id"]
            refused = await session.call_tool("forget", {"memory_id": memory_id, "dry_run": False})
            assert "may not write" in error_text(refused)

    asyncio.run(session_run())


@pytest.mark.parametrize(
    ("option", "value"),
    [("--tenant", "a b"), ("--space", "x,y"), ("--spaces", "a,,b"), ("--memory", "loud")],
)
def test_stdio_refuses_bad_options_on_stderr(tmp_path: Path, option: str, value: str) -> None:
    command = [sys.executable, "-c", "from proxy.cli.main import app; app()", "mcp"]
    process = subprocess.run(
        [*command, "--db", str(tmp_path / "m.db"), option, value],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert process.returncode == 2
    assert process.stdout == ""  # stdout is the protocol's alone
    assert option in process.stderr and "Traceback" not in process.stderr


def test_the_readme_client_examples_fit_the_command_and_the_edge() -> None:
    section = (ROOT / "README.md").read_text().split("\n## MCP server\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", section, re.DOTALL)]
    stdio, http = (block["mcpServers"]["memrelay"] for block in blocks)
    assert stdio["command"].endswith("/.venv/bin/memrelay") and stdio["args"][0] == "mcp"
    command = typer.main.get_command(app).commands["mcp"]  # type: ignore[attr-defined]
    options = {opt for param in command.params for opt in param.opts}
    given = dict(zip(stdio["args"][1::2], stdio["args"][2::2], strict=True))
    assert set(given) <= options and {"--db", "--tenant"} <= set(given)
    scope = scope_from_options(given["--tenant"], "default", given["--spaces"], "on", 16)
    assert scope.read_spaces == ("default", "work")
    assert http["type"] == "http" and http["url"].endswith(MCP_PATH)
    headers = [(k.lower().encode(), v.encode()) for k, v in http["headers"].items()]
    assert {name for name, _ in headers} <= KNOWN
    parsed = parse_headers(headers, "default", 16)
    assert parsed.memory.read_spaces == ("alice", "team") and parsed.key == "mr_..."
