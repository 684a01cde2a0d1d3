"""Transfer commands: export a tenant as JSONL, import it back."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress

from memory_core.store import MemoryStore
from proxy.cli.options import AsJson, Db, Tenant
from proxy.cli.output import emit_json, errors
from proxy.cli.store import with_store


def register(app: typer.Typer) -> None:
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
