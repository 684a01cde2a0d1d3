"""Options and value parsing shared by the CLI's command groups."""

from __future__ import annotations

import re
from typing import Annotated

import typer
from pydantic import ValidationError

from proxy.settings import Settings

Db = Annotated[
    str,
    typer.Option(
        envvar="MEMRELAY_DB", help="The memory database: a SQLite file or a postgresql:// URL."
    ),
]
Tenant = Annotated[str, typer.Option(envvar="MEMRELAY_DEFAULT_TENANT", help="Tenant id.")]
Space = Annotated[str, typer.Option(help="Space id.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
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


def load_settings(**overrides: object) -> Settings:
    """Settings from MEMRELAY_* variables, with the flags that were given on top."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise typer.BadParameter(problems) from exc
