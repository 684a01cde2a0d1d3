"""What every inspector page shares: templates, security headers, forms, the session.

Pages are server-rendered Jinja2 with autoescaping on: every memory text is escaped,
whatever it holds. Each response carries a strict Content-Security-Policy (scripts and
styles from this origin's files only, nothing inline, no framing, forms post here only).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from proxy.admin.ui.session import PREFIX, SESSION_STATE, Session
from proxy.edge.identity import Identity, IdentityMissing, identity_of

HERE = Path(__file__).parent
STATIC = HERE / "static"
HTMX = STATIC / "vendor" / "htmx.min.js"  # fetched by .ci/setup from npm (git-ignored)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
MAX_FORM_BYTES = 64 * 1024

templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html"], default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


templates.filters["when"] = when
templates.globals["prefix"] = PREFIX


class Forbidden(Exception):
    """A form without a valid CSRF token, or a tenant the key may not use."""


class Signin(Exception):
    """No valid session: the browser is sent to the sign-in page."""


def page(ui: Any, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """A rendered template with the security headers (`ui` is the Inspector)."""
    session = request.scope.get("state", {}).get(SESSION_STATE)
    context.setdefault("session", session if isinstance(session, Session) else None)
    if isinstance(session, Session):
        context.setdefault("csrf", ui.sessions.csrf_token(session))
    context.setdefault("htmx", HTMX.is_file())
    context.setdefault("open_mode", not ui.sessions.keys.enforced)
    html = templates.get_template(name).render(request=request, **context)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def redirect(url: str, headers: dict[str, str] | None = None) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers={**SECURITY_HEADERS, **(headers or {})})


def signed_in(request: Request) -> tuple[Identity, Session]:
    """Who the edge decided this browser is; Signin when it decided nobody."""
    try:
        identity = identity_of(request.scope)
    except IdentityMissing as exc:
        raise Signin() from exc
    session = request.scope["state"].get(SESSION_STATE)
    if not isinstance(session, Session):
        raise Signin()
    return identity, session


async def form(request: Request) -> dict[str, list[str]]:
    """An urlencoded form body, bounded (the pages post nothing else)."""
    size = 0
    chunks = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise Forbidden("form too large")
        chunks.append(chunk)
    text = b"".join(chunks).decode("utf-8", "replace")
    return parse_qs(text, keep_blank_values=True, max_num_fields=200)


def one(fields: dict[str, list[str]], name: str, default: str = "") -> str:
    values = fields.get(name)
    return values[0] if values else default


def url(path: str, **params: Any) -> str:
    """A link inside the inspector with query parameters (empty ones left out)."""
    pairs = [
        (k, v)
        for k, value in params.items()
        for v in (value if isinstance(value, list | tuple) else [value])
        if v not in (None, "")
    ]
    return PREFIX + path + (("?" + urlencode(pairs)) if pairs else "")


templates.globals["url"] = url


def ago(ts: float | None) -> str:
    if ts is None:
        return "-"
    seconds = max(0.0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


templates.filters["ago"] = ago

Handler = Callable[[Request], Awaitable[Response]]
