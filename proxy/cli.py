"""The `memrelay` command line: the server, and every library operation as a command."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Annotated

import httpx
import openai
import typer
import uvicorn
from pydantic import ValidationError

from proxy.cli_memory import AsJson, register
from proxy.cli_output import emit_json, table, when
from proxy.keys import KeyStore
from proxy.settings import Settings

app = typer.Typer(no_args_is_help=True, help="memrelay: an OpenAI-compatible memory proxy.")
keys_app = typer.Typer(no_args_is_help=True, help="Manage API keys (stored hashed).")
app.add_typer(keys_app, name="keys")
register(app)

KeysFile = Annotated[Path, typer.Option(envvar="MEMRELAY_KEYS_FILE", help="The keys file.")]


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


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps memrelay reachable from this machine only."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        return False
    return bool(addresses) and all(
        ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses
    )


@app.command()
def serve(
    upstream: Annotated[
        str | None, typer.Option(help="Upstream base URL ($MEMRELAY_UPSTREAM_URL).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Bind address ($MEMRELAY_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port ($MEMRELAY_PORT).")] = None,
    db: Annotated[
        str | None, typer.Option(help="SQLite file or postgresql:// URL ($MEMRELAY_DB).")
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            help="GGUF for the embedded llama.cpp when no upstream is given ($MEMRELAY_MODEL)."
        ),
    ] = None,
    keys_file: Annotated[Path | None, typer.Option(help="Keys file ($MEMRELAY_KEYS_FILE).")] = None,
    upstream_api_key: Annotated[
        str | None, typer.Option(help="memrelay's own upstream key ($MEMRELAY_UPSTREAM_API_KEY).")
    ] = None,
    insecure: Annotated[bool, typer.Option(help="Run without keys off loopback.")] = False,
    connect_timeout: Annotated[float | None, typer.Option(help="Seconds.")] = None,
    first_byte_timeout: Annotated[float | None, typer.Option(help="Seconds.")] = None,
    total_timeout: Annotated[float | None, typer.Option(help="Seconds.")] = None,
    max_body_bytes: Annotated[int | None, typer.Option(help="Chat request size limit.")] = None,
    retries: Annotated[int | None, typer.Option(help="Upstream retries.")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning.")] = None,
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
        insecure=insecure or None,
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
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if not keys.enabled and not settings.insecure and not is_loopback(settings.host):
        if settings.keys_file is None:
            why = "without keys: anyone could read any tenant. Create a key (memrelay keys "
            why += "create --keys-file FILE) and pass --keys-file FILE, or pass --insecure."
        else:
            why = f"with {settings.keys_file}, which holds no live key: nobody could use it. "
            why += f"Create one first (memrelay keys create --keys-file {settings.keys_file})."
        raise typer.BadParameter(f"refusing to serve {settings.host} {why}")
    from proxy.local_llm import LocalModelMissing
    from proxy.logs import configure_logging
    from proxy.preflight import PortBusy, check_port_free
    from proxy.wiring import build_app

    configure_logging(settings.log_level)
    try:  # before llama.cpp starts or the queue is touched (issue 14)
        check_port_free(settings.host, settings.port)
    except PortBusy as exc:
        raise typer.BadParameter(str(exc)) from exc
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


@app.command()
def chat(
    url: Annotated[str, typer.Option(help="memrelay's address.")] = "http://127.0.0.1:8421",
    tenant: Annotated[str, typer.Option(envvar="MEMRELAY_DEFAULT_TENANT")] = "default",
    model: str = "local",
    api_key: Annotated[
        str | None, typer.Option(envvar="OPENAI_API_KEY", help="Upstream key.")
    ] = None,
    memrelay_key: Annotated[str | None, typer.Option(envvar="MEMRELAY_KEY")] = None,
    max_tokens: int = 256,
) -> None:
    """Chat through memrelay; each turn shows the memories injected and what was queued."""
    from rich.console import Console
    from rich.markup import escape

    from proxy.chat_client import ChatSession

    console = Console()
    session = ChatSession(url, tenant, model, api_key, memrelay_key, max_tokens)
    console.print(f"[dim]chatting through {url} as tenant {tenant!r}; /quit to leave[/dim]")
    try:
        while True:
            try:
                text = input("you> ").strip()
            except EOFError:
                break
            if text in ("/quit", "/exit"):
                break
            if not text:
                continue
            console.print("[bold]assistant>[/bold] ", end="")
            turn = session.send(text, on_token=lambda t: console.print(t, end="", markup=False))
            console.print()
            console.print(
                f"[dim]recall: {turn.recall_status}; learning: {turn.memory_status}[/dim]"
            )
            for memory in turn.injected:
                content = escape(memory.get("content") or "(gone)")
                console.print(f"[dim]  injected {memory.get('id')}: {content}[/dim]")
    except (httpx.HTTPError, openai.APIError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    finally:
        session.close()


@keys_app.command("create")
def keys_create(
    keys_file: KeysFile,
    tenant: Annotated[
        list[str] | None, typer.Option(help="Tenant this key may use (repeatable).")
    ] = None,
    admin: Annotated[bool, typer.Option(help="Any tenant, any admin route.")] = False,
    name: str = "",
    as_json: AsJson = False,
) -> None:
    """Create a key; it is shown once and stored only as a hash."""
    if not tenant and not admin:
        raise typer.BadParameter("give at least one --tenant, or --admin")
    store = KeyStore(keys_file)
    key, record = store.create(list(tenant or []), admin=admin, name=name)
    if as_json:
        emit_json({"key": key, **record.public()})
    else:
        print(f"{record.id}: {key}\n(shown once: store it now; memrelay keeps only its hash)")


@keys_app.command("list")
def keys_list(keys_file: KeysFile, as_json: AsJson = False) -> None:
    """List keys (never the keys themselves)."""
    records = [r.public() for r in KeyStore(keys_file).records]
    if as_json:
        emit_json(records)
        return
    table(
        "keys",
        ["id", "name", "tenants", "admin", "revoked", "created (UTC)"],
        [
            [
                r["id"],
                r["name"],
                ",".join(r["tenants"]),
                r["admin"],
                r["revoked"],
                when(r["created_at"]),
            ]
            for r in records
        ],
    )


@keys_app.command("revoke")
def keys_revoke(key_id: str, keys_file: KeysFile, as_json: AsJson = False) -> None:
    """Revoke a key by id; a running memrelay stops accepting it after a restart."""
    try:
        record = KeyStore(keys_file).revoke(key_id)
    except KeyError as exc:
        raise typer.BadParameter(str(exc)) from exc
    emit_json(record.public()) if as_json else print(f"revoked {record.id}")


def main() -> None:  # pragma: no cover - console script entry
    app()
