"""CLI commands over the memory database itself (no server needed), like the admin API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.progress import Progress

from extraction.facts import Fact
from extraction.reconcile import Reconciler
from memory_core.backends import (
    connection_errors,
    describe,
    is_postgres_url,
    jobs_for,
    make_store,
)
from memory_core.embedder import FastEmbedEmbedder
from memory_core.errors import MemoryError_, NotFound
from memory_core.model import KINDS
from memory_core.recall import RecallQuery
from memory_core.store import ListQuery, MemoryStore
from proxy.cli.output import MEMORY_COLUMNS, emit_json, errors, memory_rows, table, when

T = TypeVar("T")
Db = Annotated[
    str,
    typer.Option(
        envvar="MEMRELAY_DB", help="The memory database: a SQLite file or a postgresql:// URL."
    ),
]
Tenant = Annotated[str, typer.Option(envvar="MEMRELAY_DEFAULT_TENANT", help="Tenant id.")]
Space = Annotated[str, typer.Option(help="Space id.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
JOB_STATUSES = ("pending", "leased", "done", "dead")
ID_RULE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def split_list(raw: list[str] | str | None, name: str) -> list[str]:
    """Comma-separated (and repeatable) values, like the admin API's lists; an empty
    entry ("a,,b") is refused, as the API answers 400 to it."""
    values = [raw] if isinstance(raw, str) else list(raw or [])
    out: list[str] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not ID_RULE.fullmatch(part):
                raise typer.BadParameter(
                    f"each entry of {name} must be 1 to 128 characters of A-Z a-z 0-9 . _ : -"
                    f" (got {part[:64]!r} in {value[:100]!r})",
                    param_hint=name,
                )
            if part not in out:
                out.append(part)
    return out


def with_store(db: str, work: Callable[[MemoryStore], Awaitable[T]]) -> T:
    """Open the store, run `work`, close; library errors become readable CLI errors."""

    async def main() -> T:
        options = {} if is_postgres_url(db) else {"readers": 2}
        store = make_store(db, FastEmbedEmbedder(), **options)
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
        """Recall like the proxy does, with each result's score breakdown."""
        read = split_list(spaces, "--spaces")
        results = with_store(db, lambda s: s.recall(RecallQuery(tenant, read, query, top_k=top_k)))
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

    @app.command()
    def export(
        output: Annotated[Path, typer.Argument(help="JSONL file to write ('-' for stdout).")],
        db: Db = "memrelay.db",
        tenant: Tenant = "default",
        as_json: AsJson = False,
    ) -> None:
        """Export a tenant as JSONL (streamed; progress shown on large tenants)."""

        async def work(store: MemoryStore) -> int:
            total = (await store.stats(tenant))["total"]
            count = 0
            to_stdout = str(output) == "-"
            sink = (
                contextlib.nullcontext(sys.stdout)
                if to_stdout
                else output.open("w", encoding="utf-8")
            )
            with (
                sink as handle,
                Progress(disable=as_json or to_stdout or total < 1000, transient=True) as bar,
            ):
                task = bar.add_task("exporting", total=total)
                async for line in store.export(tenant):
                    handle.write(line + "\n")
                    count += 1
                    bar.advance(task)
            return count

        count = with_store(db, work)
        if str(output) != "-":
            emit_json({"exported": count, "file": str(output)}) if as_json else print(
                f"exported {count} memories"
            )

    @app.command("import")
    def import_(
        source: Annotated[Path, typer.Argument(help="JSONL file from export.")],
        db: Db = "memrelay.db",
        tenant: Tenant = "default",
        as_json: AsJson = False,
    ) -> None:
        """Import JSONL from export; ids and history are kept, importing twice changes nothing."""
        if not source.is_file():
            raise typer.BadParameter(f"no such file: {source}")
        lines = source.read_text(encoding="utf-8").splitlines()

        async def work(store: MemoryStore) -> dict[str, Any]:
            totals: dict[str, Any] = {"imported": 0, "skipped": 0, "errors": []}
            with Progress(disable=as_json or len(lines) < 1000, transient=True) as bar:
                task = bar.add_task("importing", total=len(lines))
                for start in range(0, len(lines), 500):
                    result = await store.import_lines(tenant, lines[start : start + 500])
                    totals["imported"] += result.imported
                    totals["skipped"] += result.skipped
                    totals["errors"] += result.errors
                    bar.advance(task, 500)
            return totals

        totals = with_store(db, work)
        if as_json:
            emit_json(totals)
        else:
            imported, skipped = totals["imported"], totals["skipped"]
            print(f"imported {imported}, skipped {skipped}, errors {len(totals['errors'])}")
            for problem in totals["errors"][:20]:
                errors.print(f"  {problem}")
        if totals["errors"]:
            raise typer.Exit(1)

    @app.command()
    def jobs(
        db: Db = "memrelay.db",
        tenant: Tenant = "default",
        status: Annotated[
            list[str] | None,
            typer.Option(help="pending, leased, done, dead (comma-separated or repeated)."),
        ] = None,
        retry: Annotated[str | None, typer.Option(help="Retry this dead-lettered job.")] = None,
        purge: Annotated[str | None, typer.Option(help="Delete this dead-lettered job.")] = None,
        limit: int = 50,
        as_json: AsJson = False,
    ) -> None:
        """Extraction jobs: pending, dead-lettered; retry one."""
        statuses = split_list(status, "--status") or None
        for value in statuses or []:
            if value not in JOB_STATUSES:
                raise typer.BadParameter(
                    f"must be one of {', '.join(JOB_STATUSES)} (got {value!r})",
                    param_hint="--status",
                )

        async def work(store: MemoryStore) -> Any:
            queue = jobs_for(store)
            if retry:
                return (await queue.retry(tenant, retry)).as_dict()
            if purge:
                await queue.purge(tenant, purge)
                return {"id": purge, "purged": True}
            return {
                "data": [j.as_dict() for j in await queue.list_jobs(tenant, statuses, limit)],
                "counts": await queue.job_counts(tenant),
            }

        result = with_store(db, work)
        if as_json:
            emit_json(result)
        elif retry:
            print(f"queued again: {result['id']}")
        elif purge:
            print(f"purged: {result['id']}")
        else:
            table(
                f"jobs of {tenant}",
                ["id", "space", "status", "attempts", "last error", "updated (UTC)"],
                [
                    [
                        j["id"],
                        j["space"],
                        j["status"],
                        f"{j['attempts']}/{j['max_attempts']}",
                        (j["last_error"] or "")[:80],
                        when(j["updated_at"]),
                    ]
                    for j in result["data"]
                ],
            )
            print(", ".join(f"{k} {v}" for k, v in result["counts"].items()))

    @app.command()
    def migrate(db: Db = "memrelay.db", as_json: AsJson = False) -> None:
        """Create or upgrade the schema (SQLite file or Postgres database); print its version.

        `memrelay serve` does the same at start; run this first when several replicas
        share one Postgres database, or to check a database before deploying.
        """

        async def work(store: MemoryStore) -> int:
            return int(getattr(store, "schema_version", 0))

        version = with_store(db, work)
        result = {"database": describe(db), "schema_version": version}
        if as_json:
            emit_json(result)
        else:
            print(f"{result['database']}: schema version {version}")

    @app.command()
    def lint(db: Db = "memrelay.db", as_json: AsJson = False) -> None:
        """Check integrity; exits 1 when anything is out of step."""
        findings = with_store(db, lambda s: s.lint())
        if as_json:
            emit_json([f.as_dict() for f in findings])
        elif findings:
            table(
                "integrity problems",
                ["check", "memory", "detail"],
                [[f.check, f.memory_id, f.detail] for f in findings],
            )
        else:
            print("ok: no integrity problems")
        if findings:
            raise typer.Exit(1)
