"""The `memrelay` command line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
import uvicorn
from pydantic import ValidationError

from proxy.settings import Settings

app = typer.Typer(no_args_is_help=True, help="memrelay: an OpenAI-compatible memory proxy.")


@app.callback()
def main() -> None:
    """memrelay: an OpenAI-compatible memory proxy."""


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


@app.command()
def serve(
    upstream: Annotated[
        str | None, typer.Option(help="Upstream base URL ($MEMRELAY_UPSTREAM_URL).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Bind address ($MEMRELAY_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port ($MEMRELAY_PORT).")] = None,
    db: Annotated[Path | None, typer.Option(help="Memory database ($MEMRELAY_DB).")] = None,
    connect_timeout: Annotated[float | None, typer.Option(help="Seconds.")] = None,
    first_byte_timeout: Annotated[float | None, typer.Option(help="Seconds.")] = None,
    total_timeout: Annotated[float | None, typer.Option(help="Seconds.")] = None,
    max_body_bytes: Annotated[int | None, typer.Option(help="Chat request size limit.")] = None,
    retries: Annotated[int | None, typer.Option(help="Upstream retries.")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning.")] = None,
) -> None:
    """Run the proxy."""
    settings = load_settings(
        upstream_url=upstream,
        host=host,
        port=port,
        db=db,
        connect_timeout=connect_timeout,
        first_byte_timeout=first_byte_timeout,
        total_timeout=total_timeout,
        max_body_bytes=max_body_bytes,
        retries=retries,
        log_level=log_level,
    )
    if not settings.upstream_url:
        raise typer.BadParameter("no upstream: pass --upstream URL or set MEMRELAY_UPSTREAM_URL")
    from proxy.wiring import build_app

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    uvicorn.run(
        build_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        server_header=False,
        date_header=False,
    )
