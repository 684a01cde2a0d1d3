"""Ledger commands: a tenant's memories with their fate, one memory's history, the
change feed and the counts."""

from __future__ import annotations

import json
from typing import Any

import typer

from memory_core.store import ListQuery, MemoryStore
from proxy.cli.options import AsJson, Db, Tenant
from proxy.cli.output import emit_json, errors, table, when
from proxy.cli.store import with_store


def register(app: typer.Typer) -> None:
    @app.command()
    def inspect(
        db: Db = "memrelay.db", tenant: Tenant = "default", as_json: AsJson = False
    ) -> None:
        """The tenant's ledger: every memory, its status, what superseded what, and why."""

        async def work(store: MemoryStore) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            cursor = None
            while True:
                page = await store.list(ListQuery(tenant, statuses=None, limit=1000, cursor=cursor))
                out += [m.as_dict() for m in page.items]
                cursor = page.next_cursor
                if not cursor:
                    return out[::-1]

        ledger = with_store(db, work)
        if as_json:
            emit_json(ledger)
            return
        table(
            f"ledger of {tenant}",
            ["id", "status", "content", "superseded by", "why", "updated (UTC)"],
            [
                [
                    m["id"],
                    m["status"],
                    m["content"] or "(erased)",
                    m["superseded_by"],
                    m["status_reason"],
                    when(m["updated_at"]),
                ]
                for m in ledger
            ],
        )

    @app.command()
    def history(
        memory_id: str,
        db: Db = "memrelay.db",
        tenant: Tenant = "default",
        as_json: AsJson = False,
    ) -> None:
        """How one memory came to be what it is."""
        events = with_store(db, lambda s: s.history(tenant, memory_id))
        if not events:
            errors.print(
                f"no history for {memory_id!r} in tenant {tenant!r}"
                " (other tenants: pass --tenant or set MEMRELAY_DEFAULT_TENANT)"
            )
            raise typer.Exit(1)
        _events(events, as_json, f"history of {memory_id}")

    @app.command()
    def events(
        db: Db = "memrelay.db",
        tenant: Tenant = "default",
        since: int = 0,
        limit: int = 100,
        as_json: AsJson = False,
    ) -> None:
        """The change feed after a cursor (the last seq you saw)."""
        _events(
            with_store(db, lambda s: s.events(tenant, since, limit)), as_json, f"events of {tenant}"
        )

    def _events(items: list[Any], as_json: bool, title: str) -> None:
        if as_json:
            emit_json([e.as_dict() for e in items])
            return
        table(
            title,
            ["seq", "memory", "action", "actor", "reason", "detail", "at (UTC)"],
            [
                [e.seq, e.memory_id, e.action, e.actor, e.reason, json.dumps(e.detail), when(e.at)]
                for e in items
            ],
        )

    @app.command()
    def stats(db: Db = "memrelay.db", tenant: Tenant = "default", as_json: AsJson = False) -> None:
        """Counts by status, kind and space."""
        data = with_store(db, lambda s: s.stats(tenant))
        if as_json:
            emit_json(data)
            return
        for key in ("by_status", "by_kind", "by_space"):
            table(
                f"{tenant}: {key.removeprefix('by_')}",
                ["value", "count"],
                sorted(data[key].items()),
            )
        print(f"total {data['total']}, events {data['events']}")
