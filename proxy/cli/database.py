"""Database commands: create or upgrade the schema, check integrity."""

from __future__ import annotations

import typer

from memory_core.backends import describe
from memory_core.store import MemoryStore
from proxy.cli.options import AsJson, Db
from proxy.cli.output import emit_json, table
from proxy.cli.store import with_store


def register(app: typer.Typer) -> None:
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
