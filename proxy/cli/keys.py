"""`memrelay keys`: create, list and revoke API keys (stored hashed)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from proxy.cli.options import AsJson, load_settings
from proxy.cli.output import emit_json, table, when
from proxy.edge.keys import KeyStore

keys_app = typer.Typer(no_args_is_help=True, help="Manage API keys (stored hashed).")

KeysFile = Annotated[
    Path | None,
    typer.Option(
        envvar="MEMRELAY_KEYS_FILE",
        help="The keys file (default: the server's setting, $MEMRELAY_KEYS_FILE).",
    ),
]


def keys_path(keys_file: Path | None) -> Path:
    """The keys file given, or the one the server reads; a one-line error when neither."""
    if keys_file is None:
        keys_file = load_settings().keys_file
    if keys_file is None:
        raise typer.BadParameter(
            "no keys file: pass --keys-file or set MEMRELAY_KEYS_FILE (the server's setting)",
            param_hint="--keys-file",
        )
    return keys_file


def open_keys(keys_file: Path | None) -> KeyStore:
    path = keys_path(keys_file)
    try:
        return KeyStore(path)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--keys-file") from exc


@keys_app.command("create")
def keys_create(
    keys_file: KeysFile = None,
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
    store = open_keys(keys_file)
    key, record = store.create(list(tenant or []), admin=admin, name=name)
    if as_json:
        emit_json({"key": key, **record.public()})
    else:
        print(f"{record.id}: {key}\n(shown once: store it now; memrelay keeps only its hash)")


@keys_app.command("list")
def keys_list(keys_file: KeysFile = None, as_json: AsJson = False) -> None:
    """List keys (never the keys themselves)."""
    path = keys_path(keys_file)
    if not path.exists():
        raise typer.BadParameter(
            f"{path} does not exist (create a key first)", param_hint="--keys-file"
        )
    records = [r.public() for r in open_keys(path).records]
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
def keys_revoke(key_id: str, keys_file: KeysFile = None, as_json: AsJson = False) -> None:
    """Revoke a key by id; a running memrelay stops accepting it after a restart."""
    store = open_keys(keys_file)
    try:
        record = store.revoke(key_id)
    except KeyError as exc:
        raise typer.BadParameter(str(exc)) from exc
    emit_json(record.public()) if as_json else print(f"revoked {record.id}")
