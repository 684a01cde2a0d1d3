"""How CLI commands print: JSON with --json, rich tables otherwise."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
errors = Console(stderr=True, soft_wrap=True)  # one error, one line


def when(timestamp: float | None) -> str:
    if timestamp is None:
        return ""
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2, default=str) + "\n")


def table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    grid = Table(title=title, show_lines=False)
    for column in columns:
        grid.add_column(column, overflow="fold")
    for row in rows:
        grid.add_row(*("" if v is None else str(v) for v in row))
    console.print(grid)


def memory_rows(memories: Iterable[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            m["id"],
            m["status"],
            m["kind"],
            m["space"],
            m["content"] or "(erased)",
            f"{m['confidence']:.2f}",
            when(m["updated_at"]),
        ]
        for m in memories
    ]


MEMORY_COLUMNS = ["id", "status", "kind", "space", "content", "conf", "updated (UTC)"]


def fail(message: str, code: int = 2) -> NoReturn:
    """One readable line on stderr (never a traceback or a wrapped panel), then exit."""
    errors.print(f"[red]error:[/red] {escape(message)}")
    raise SystemExit(code)
