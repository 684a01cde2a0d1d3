"""The official MCP SDK's own client session, over streamable HTTP or a real stdio process."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import REQUEST_TIMEOUT, CallToolResult

ROOT = Path(__file__).resolve().parent.parent
TOOLS = {"recall", "remember", "correct", "forget", "list", "history"}


async def start(session: ClientSession, era: str) -> None:
    """`legacy`: the initialize handshake (2025 protocol); `modern`: server/discover.

    The SDK gives server/discover 10 seconds; a process still importing on a loaded
    machine may miss that, so a timed-out probe is asked again (the SDK's own `mode=auto`
    falls back to initialize instead)."""
    if era == "legacy":
        await session.initialize()
        return
    for attempt in range(6):
        try:
            await session.discover()
            return
        except MCPError as exc:
            if exc.code != REQUEST_TIMEOUT or attempt == 5:
                raise


@asynccontextmanager
async def http_session(
    url: str, headers: dict[str, str], era: str = "legacy"
) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(url + "/memrelay/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await start(session, era)
        yield session


@asynccontextmanager
async def stdio_session(args: list[str], era: str = "legacy") -> AsyncIterator[ClientSession]:
    """A real `memrelay mcp` process, started the way a desktop client starts it."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", "from proxy.cli.main import app; app()", "mcp", *args],
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))},
        cwd=str(ROOT),
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, read_timeout_seconds=120) as session,
    ):
        await start(session, era)
        yield session


def data(result: CallToolResult) -> dict[str, Any]:
    """A successful tool result's structured answer (and its text says the same)."""
    assert not result.is_error, result.content
    assert result.structured_content is not None
    assert json.loads(result.content[0].text) == result.structured_content  # type: ignore[union-attr]
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result.structured_content
    return " ".join(getattr(block, "text", "") for block in result.content)


def everything(result: CallToolResult) -> str:
    """All a result says, to search for another tenant's words."""
    return json.dumps(result.model_dump(mode="json"))
