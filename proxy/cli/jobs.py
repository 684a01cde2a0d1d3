"""The extraction jobs command: list them, retry or purge a dead-lettered one."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memory_core.backends import jobs_for
from memory_core.store import MemoryStore
from proxy.cli.options import AsJson, Db, Tenant, split_list
from proxy.cli.output import emit_json, table, when
from proxy.cli.store import with_store

JOB_STATUSES = ("pending", "leased", "done", "dead")


def register(app: typer.Typer) -> None:
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
