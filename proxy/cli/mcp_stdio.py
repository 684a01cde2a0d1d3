"""`memrelay mcp`: the MCP server over stdio, for desktop clients that start it themselves.

The tenant, the spaces and the memory mode are this command's options, fixed for the
whole process: no tool argument can change them (proxy/admin/mcp_server.py). It opens the
database directly, like the other library commands; stdout carries only the protocol,
every log line goes to stderr.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import typer

from proxy.cli.options import ID_RULE, Db, Tenant, load_settings, split_list
from proxy.memory.scoping import MODES, MemoryScope


def _one_id(value: str, name: str) -> str:
    if not ID_RULE.fullmatch(value):
        raise typer.BadParameter(
            f"must be 1 to 128 characters of A-Z a-z 0-9 . _ : - (got {value[:64]!r})",
            param_hint=name,
        )
    return value


def scope_from_options(
    tenant: str, space: str, spaces: str | None, memory: str, max_read_spaces: int
) -> MemoryScope:
    """The fixed scope, checked with the rules the edge applies to the same headers."""
    write_space = _one_id(space, "--space")
    read = split_list(spaces, "--spaces") if spaces is not None else [write_space]
    if len(read) > max_read_spaces:
        raise typer.BadParameter(
            f"at most {max_read_spaces} spaces (MEMRELAY_MAX_READ_SPACES); got {len(read)}",
            param_hint="--spaces",
        )
    if memory not in MODES:
        raise typer.BadParameter(f"must be one of {', '.join(MODES)}", param_hint="--memory")
    return MemoryScope(_one_id(tenant, "--tenant"), write_space, tuple(read), memory)


def mcp(
    db: Db = "memrelay.db",
    tenant: Tenant = "default",
    space: Annotated[
        str, typer.Option(help="The space remember and correct write to.")
    ] = "default",
    spaces: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated spaces recall, list, history and forget read "
            "(default: the write space)."
        ),
    ] = None,
    memory: Annotated[
        str,
        typer.Option(help="on; read (no writes); write (no reads); off (every tool refused)."),
    ] = "on",
    log_level: Annotated[
        str, typer.Option(envvar="MEMRELAY_LOG_LEVEL", help="Logged to stderr.")
    ] = "warning",
) -> None:
    """Serve this database's memory to an MCP client over stdio (recall, remember,
    correct, forget, list, history) as one tenant and its spaces."""
    settings = load_settings()
    scope = scope_from_options(tenant, space, spaces, memory, settings.max_read_spaces)
    from mcp.server.mcpserver.exceptions import ToolError

    from extraction.reconcile import Reconciler
    from memory_core.backends import describe, is_postgres_url, make_store
    from memory_core.embedder import make_embedder
    from proxy.admin.mcp_server import build_server, fixed_caller
    from proxy.cli.serve import check_database
    from proxy.logs import configure_logging

    configure_logging(log_level)  # JSON lines on stderr, before the SDK would add its own
    check_database(db)
    embedder = make_embedder(settings.embedder, query_model=settings.query_model)
    store = make_store(db, embedder, **({} if is_postgres_url(db) else {"readers": 2}))

    opening: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def opened(_server: Any) -> AsyncIterator[None]:
        """Open the store while the client connects, so the handshake is answered at once
        (clients give it a few seconds); tools wait for it (`ready`)."""
        nonlocal opening
        opening = asyncio.create_task(store.start())
        try:
            yield
        finally:
            if not opening.done():
                opening.cancel()
            await asyncio.wait({opening})  # never raises the opening's own error
            if not opening.cancelled() and opening.exception() is None:
                await store.close()

    async def ready() -> None:
        assert opening is not None
        try:
            await asyncio.shield(opening)
        except Exception as exc:
            raise ToolError(f"cannot open {describe(db)}: {exc}") from exc

    server = build_server(
        store,
        Reconciler(store, None, actor="mcp"),
        fixed_caller(scope),
        ready,
        standing=settings.standing_policy(),
        lifespan=opened,
    )
    try:
        asyncio.run(server.run_stdio_async())
    except KeyboardInterrupt:
        pass


def register(app: typer.Typer) -> None:
    app.command()(mcp)
