"""The `memrelay` command line: the server, and every library operation as a command.

Each command group lives in its own module under proxy/cli/ and registers itself here,
in the order `memrelay --help` lists them.
"""

from __future__ import annotations

from typing import Annotated

import httpx
import openai
import typer

from proxy.cli import database, jobs, ledger, mcp_stdio, memories, serve, transfer
from proxy.cli.keys import keys_app

app = typer.Typer(no_args_is_help=True, help="memrelay: an OpenAI-compatible memory proxy.")
app.add_typer(keys_app, name="keys")
for group in (memories, ledger, transfer, jobs, database, serve):
    group.register(app)


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

    from proxy.cli.chat import ChatSession

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
    except (httpx.TransportError, openai.APIConnectionError) as exc:
        console.print(f"[red]error:[/red] cannot reach memrelay at {url} (--url): {exc}")
        raise typer.Exit(1) from exc
    except (httpx.HTTPError, openai.APIError) as exc:
        console.print(f"[red]error:[/red] {url}: {exc}")
        raise typer.Exit(1) from exc
    finally:
        session.close()


mcp_stdio.register(app)


def main() -> None:  # pragma: no cover - console script entry
    app()
