"""The edge: one pure-ASGI middleware that decides who a request is, before anything else.

In one pass it normalises the path, bounds the headers (431) and the declared body
(413), parses the memrelay headers once (a repeated one, a repeated Authorization or an
unknown X-Memrelay-* header is a 400), checks the key (401) and the tenant it is bound
to (403), refuses paths that are neither memrelay's nor on the pass-through list (404),
then removes every X-Memrelay-* header from the scope and stores the frozen decision,
an `Identity`, in `scope["state"]` (see proxy/edge/identity.py). Keys are never logged.

With no keys file memrelay runs open (the CLI refuses that off loopback). With one,
every request needs a live key, whatever its path (only the liveness and readiness
probes are exempt): in `X-Memrelay-Key`, or as `Authorization: Bearer` when memrelay
holds its own upstream key (which then replaces it) or on memrelay's own routes.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from proxy.edge.identity import (
    LOG_FIELDS,
    STATE_KEY,
    TENANT_PARAM,
    BadRequestHeaders,
    Identity,
    parse_headers,
)
from proxy.edge.keys import KeyStore
from proxy.relay.asgi import ASGIApp, Receive, Scope, Send
from proxy.relay.errors import send_error
from proxy.relay.paths import (
    CHAT,
    MEMORY_ROUTES,
    MEMRELAY,
    OWN,
    PUBLIC,
    canonical,
    may_pass_through,
    parse_extras,
    raw_form,
)
from proxy.settings import Settings

log = logging.getLogger("memrelay.auth")
IMPORT = "/memrelay/v1/import"
BODY_LIMIT = "memrelay_body_limit"


class BrowserSessions(Protocol):
    """The inspector's cookie sessions (proxy/admin/ui/session.py): on its paths the
    session cookie, not a header, is the credential, and it is read here, once."""

    def serves(self, path: str) -> bool: ...

    def identify(
        self, headers: list[tuple[bytes, bytes]], state: dict[str, Any]
    ) -> Identity | None: ...


def body_limit(settings: Settings, method: str, path: str) -> int | None:
    """Largest body memrelay accepts on this route; None for pass-through (streamed)."""
    if path in MEMORY_ROUTES and method == "POST":
        return settings.max_body_bytes
    if path == IMPORT:
        return settings.import_max_bytes
    if path.startswith(MEMRELAY) or path in OWN:
        return settings.admin_max_body_bytes
    return None


class AuthMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        keys: KeyStore,
        settings: Settings,
        browser: BrowserSessions | None = None,
    ) -> None:
        self.app = app
        self.keys = keys
        self.settings = settings
        self.browser = browser
        self.extras = parse_extras(settings.passthrough_extra_paths)
        self.upstream_auth = (
            b"Bearer " + settings.upstream_api_key.encode() if settings.upstream_api_key else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":  # memrelay serves no websockets
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        raw_headers = scope["headers"]
        size = sum(len(k) + len(v) for k, v in raw_headers)
        if size > self.settings.max_header_bytes:
            await send_error(
                send,
                431,
                f"request headers are {size} bytes; at most {self.settings.max_header_bytes}",
                code="headers_too_large",
            )
            return
        path = canonical(scope["path"])
        method = scope["method"]
        try:
            parsed = parse_headers(
                raw_headers, self.settings.default_tenant, self.settings.max_read_spaces
            )
        except BadRequestHeaders as exc:
            await send_error(send, 400, exc.message, code=exc.code, param=exc.param)
            return
        local = path.startswith(MEMRELAY) or path in OWN  # answered here, never forwarded
        own = local or (path in MEMORY_ROUTES and method == "POST")
        record = None
        # Inspector pages: the session cookie is the credential; signed out, no identity.
        browser = self.browser if self.browser and self.browser.serves(path) else None
        if self.keys.enforced and path not in PUBLIC and browser is None:
            presented = parsed.key
            # A Bearer key is memrelay's only where Authorization never reaches the upstream.
            if presented is None and (self.upstream_auth is not None or local):
                presented = parsed.bearer
            record = self.keys.check(presented)
            if record is None:
                log.info("rejected a request with a missing or unknown key")
                await send_error(
                    send,
                    401,
                    "missing or invalid memrelay key (X-Memrelay-Key)",
                    "authentication_error",
                    "invalid_memrelay_key",
                )
                return
            memory = path in MEMORY_ROUTES and method == "POST"
            needs_tenant = memory or path == CHAT or path.startswith(MEMRELAY)
            needs_tenant = needs_tenant or parsed.tenant_given
            if needs_tenant and not record.allows(parsed.memory.tenant):
                log.info("key %s refused for a tenant it is not bound to", record.id)
                await send_error(
                    send,
                    403,
                    "this key may not use that tenant",
                    "permission_error",
                    "tenant_not_allowed",
                    param=TENANT_PARAM,
                )
                return
        if not own and not may_pass_through(path, self.extras):
            await send_error(
                send,
                404,
                f"no route {path}: memrelay forwards /v1/* and the paths named in "
                "MEMRELAY_PASSTHROUGH_EXTRA_PATHS",
                code="route_not_found",
            )
            return
        limit = body_limit(self.settings, method, path)
        if limit is not None:
            declared = _content_length(parsed.kept)
            if declared == -1:
                await send_error(send, 400, "Content-Length is not a number", code="bad_length")
                return
            if declared is not None and declared > limit:
                await send_error(
                    send,
                    413,
                    f"request body of {declared} bytes exceeds {limit} bytes",
                    code="body_too_large",
                )
                return
        headers = parsed.kept
        if self.upstream_auth is not None:
            headers = [(k, v) for k, v in headers if k.lower() != b"authorization"]
            headers.append((b"authorization", self.upstream_auth))
        state = scope.setdefault("state", {})
        identity: Identity | None = Identity(
            key_id=record.id if record else None,
            admin=record.admin if record else False,
            memory=parsed.memory,
            tenant_given=parsed.tenant_given,
        )
        if browser is not None:
            identity = browser.identify(parsed.kept, state)
        if identity is not None:
            state[STATE_KEY] = identity
        state[BODY_LIMIT] = limit
        scope["headers"] = headers
        if path != scope["path"] or scope.get("raw_path") != path.encode("utf-8", "replace"):
            scope["path"] = path
            scope["raw_path"] = raw_form(path)
        token = LOG_FIELDS.set(
            (identity.key_id or "-", identity.tenant) if identity else ("-", "-")
        )
        try:
            await self.app(scope, receive, send)
        finally:
            LOG_FIELDS.reset(token)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared body size; None if absent, -1 if malformed or repeated."""
    found = None
    for name, value in headers:
        if name.lower() == b"content-length":
            if found is not None or not value.strip().isdigit():
                return -1
            found = int(value)
    return found
