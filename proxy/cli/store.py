"""Opening the memory database for one CLI command (no server needed)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import typer
from rich.markup import escape

from memory_core.backends import connection_errors, describe, is_postgres_url, make_store
from memory_core.embedder import make_embedder
from memory_core.errors import MemoryError_, NotFound
from memory_core.store import MemoryStore
from proxy.cli.options import load_settings
from proxy.cli.output import errors

T = TypeVar("T")


def with_store(db: str, work: Callable[[MemoryStore], Awaitable[T]]) -> T:
    """Open the store, run `work`, close; library errors become readable CLI errors."""

    async def main() -> T:
        options = {} if is_postgres_url(db) else {"readers": 2}
        settings = load_settings()
        embedder = make_embedder(settings.embedder, query_model=settings.query_model)
        store = make_store(db, embedder, **options)
        await store.start()
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return asyncio.run(main())
    except NotFound as exc:
        errors.print(
            f"[red]error:[/red] {escape(str(exc))} (other tenants: pass --tenant or set "
            "MEMRELAY_DEFAULT_TENANT)"
        )
        raise typer.Exit(2) from exc
    except MemoryError_ as exc:
        errors.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    except connection_errors() as exc:
        errors.print(f"[red]error:[/red] cannot open {describe(db)}: {exc}")
        raise typer.Exit(2) from exc
