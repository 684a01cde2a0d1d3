"""Pure ASGI middleware binding requests to keys, and keys to tenants.

With no keys configured memrelay runs open (the CLI refuses that off loopback). With
keys, every /v1 and /memrelay/v1 request needs one: in `X-Memrelay-Key`, or, when
memrelay holds its own upstream key, as the client's `Authorization: Bearer`, which is
then replaced by the upstream key before forwarding. A missing or unknown key is a 401,
a tenant outside the key's list a 403. Keys are never logged or echoed.
"""

from __future__ import annotations

import logging
import re

from proxy.asgi import ASGIApp, Receive, Scope, Send, header_value
from proxy.errors import send_error
from proxy.keys import KeyStore

log = logging.getLogger("memrelay.auth")
PROTECTED = ("/v1/", "/memrelay/v1/")
_BEARER = re.compile(rb"^\s*bearer\s+(\S+)\s*$", re.IGNORECASE)


class AuthMiddleware:
    def __init__(
        self, app: ASGIApp, keys: KeyStore, default_tenant: str, upstream_api_key: str | None
    ) -> None:
        self.app = app
        self.keys = keys
        self.default_tenant = default_tenant
        self.upstream_api_key = upstream_api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PROTECTED):
            await self.app(scope, receive, send)
            return
        if not self.keys.enabled:
            if self.upstream_api_key:
                self._set_upstream_key(scope)
            await self.app(scope, receive, send)
            return
        presented = header_value(scope, b"x-memrelay-key")
        if presented is None and self.upstream_api_key:
            match = _BEARER.match(header_value(scope, b"authorization") or b"")
            presented = match.group(1) if match else None
        record = self.keys.check(presented.decode("latin-1")) if presented else None
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
        tenant_raw = header_value(scope, b"x-memrelay-tenant")
        tenant = (
            tenant_raw.decode("latin-1").strip() if tenant_raw is not None else self.default_tenant
        )
        needs_tenant = (
            scope["path"].startswith("/memrelay/v1/") or scope["path"] == "/v1/chat/completions"
        )
        if needs_tenant and not record.allows(tenant):
            log.info("key %s refused for a tenant it is not bound to", record.id)
            await send_error(
                send,
                403,
                "this key may not use that tenant",
                "permission_error",
                "tenant_not_allowed",
                param="X-Memrelay-Tenant",
            )
            return
        scope.setdefault("state", {})["memrelay_key_id"] = record.id
        if self.upstream_api_key:
            self._set_upstream_key(scope)
        await self.app(scope, receive, send)

    def _set_upstream_key(self, scope: Scope) -> None:
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"]
        headers.append((b"authorization", b"Bearer " + self.upstream_api_key.encode()))  # type: ignore[union-attr]
        scope["headers"] = headers
