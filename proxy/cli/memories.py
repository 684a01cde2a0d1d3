"""Memory commands: remember, recall, forget and list, over the database itself."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from extraction.facts import Fact
from extraction.reconcile import Reconciler
from memory_core.model import KINDS
from memory_core.recall import RecallQuery
from memory_core.store import ListQuery, MemoryStore
from proxy.cli.options import AsJson, Db, Space, Tenant, load_settings, split_list
from proxy.cli.output import MEMORY_COLUMNS, emit_json, memory_rows, table
from proxy.cli.store import with_store


def register(app: typer.Typer) -> None:
    @app.command()
    def remember(
        content: str,
        db: Db = "memrelay.db",
        tenant: Tenant = "default",
        space: Space = "default",
        kind: str = "fact",
        subject: str | None = None,
        attribute: str | None = None,
        value: str | None = None,
        confidence: float = 0.9,
        as_json: AsJson = False,
        print_id: Annotated[
            bool, typer.Option("--print-id", help="Print only the memory's id (for scripts).")
        ] = False,
    ) -> None:
        """Remember something; reconciled like extracted facts (it may supersede)."""
        if kind not in KINDS:
            raise typer.BadParameter(f"kind must be one of {', '.join(KINDS)}")

        async def work(store: MemoryStore) -> dict[str, Any]:
            fact = Fact(content, kind, subject, attribute, value, confidence, stated_by="admin")
            outcome = await Reconciler(store, None, actor="cli").apply(
                tenant, space, fact, {"via": "cli", "time": time.time()}
            )
            memory = await store.get(tenant, outcome.memory_id) if outcome.memory_id else None
            return {**outcome.as_dict(), "memory": memory.as_dict() if memory else None}

        result = with_store(db, work)
        if as_json:
            emit_json(result)
        elif print_id:
            print(result["memory_id"])
        else:
            extra = f" (superseded {', '.join(result['old_ids'])})" if result["old_ids"] else ""
            print(f"{result['action']}: {result['memory_id']}{extra}")

    @app.command()
    def recall(
        query: str,
        db: Db = "memrelay.db",
        tenant: Tenant = "default",
        spaces: Annotated[str, typer.Option(help="Comma-separated read spaces.")] = "default",
        top_k: Annotated[
            int,
            typer.Option(
                envvar="MEMRELAY_RECALL_TOP_K", min=1, max=100, help="Memories recalled at most."
            ),
        ] = 8,
        as_json: AsJson = False,
    ) -> None:
        """Recall like the proxy does (standing rules included), with each result's
        score breakdown."""
        read = split_list(spaces, "--spaces")
        standing = load_settings().standing_policy()
        results = with_store(
            db, lambda s: s.recall(RecallQuery(tenant, read, query, top_k=top_k, standing=standing))
        )
        if as_json:
            emit_json([r.as_dict() for r in results])
            return
        table(
            f"recall: {query!r}",
            ["score", "id", "kind", "content", "why"],
            [
                [
                    f"{r.score:.4f}",
                    r.memory.id,
                    r.memory.kind,
                    r.memory.content,
                    ", ".join(f"{k}={v}" for k, v in r.breakdown.items() if k != "score"),
                ]
                for r in results
            ],
        )

    @app.command()
    def forget(
        memory_id: str,
        db: Db = "memrelay.db",
        tenant: Tenant = "default",
        reason: str = "forgotten from the CLI",
        as_json: AsJson = False,
    ) -> None:
        """Forget one memory: its content, vector and text are erased."""
        memory = with_store(db, lambda s: s.forget(tenant, memory_id, reason, actor="cli"))
        emit_json(memory.as_dict()) if as_json else print(f"forgotten: {memory.id}")

    @app.command("list")
    def list_(
        db: Db = "memrelay.db",
        tenant: Tenant = "default",
        space: Annotated[list[str] | None, typer.Option(help="Space (repeatable).")] = None,
        status: Annotated[list[str] | None, typer.Option(help="Status (repeatable).")] = None,
        kind: Annotated[list[str] | None, typer.Option(help="Kind (repeatable).")] = None,
        limit: int = 50,
        cursor: str | None = None,
        as_json: AsJson = False,
    ) -> None:
        """List memories (active by default)."""
        query = ListQuery(
            tenant, space or None, status or ["active"], kind or None, limit=limit, cursor=cursor
        )
        page = with_store(db, lambda s: s.list(query))
        data = [m.as_dict() for m in page.items]
        if as_json:
            emit_json({"data": data, "next_cursor": page.next_cursor})
            return
        table(f"memories of {tenant}", MEMORY_COLUMNS, memory_rows(data))
        if page.next_cursor:
            print(f"more: --cursor {page.next_cursor}")
