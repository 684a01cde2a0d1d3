"""The two seams through which memory plugs into a chat completion.

`before` runs before the request leaves for the upstream and may rewrite the body or
reject the request; `after` receives the assembled exchange in the background, once the
client has its whole answer. The proxy itself knows nothing of memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.relay.exchange import Exchange


class RequestRejected(Exception):
    """Raised by `before` to refuse a request with an OpenAI-style error."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


@dataclass
class ChatContext:
    """One chat completion as it passes through the proxy."""

    request_id: str
    headers: dict[str, str]
    body: dict[str, Any]
    body_changed: bool = False
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)

    def set_body(self, body: dict[str, Any]) -> None:
        self.body = body
        self.body_changed = True

    def add_response_header(self, name: str, value: str) -> None:
        self.response_headers.append((name.lower().encode(), value.encode("latin-1", "replace")))


class ChatInterceptor(Protocol):
    async def before(self, ctx: ChatContext) -> None:
        """Before the request goes upstream: may rewrite the body or raise RequestRejected."""

    def response_started(self, ctx: ChatContext, status: int) -> None:
        """The upstream status is known and headers are about to be sent: last chance to
        add response headers."""

    async def after(self, ctx: ChatContext, exchange: Exchange) -> None:
        """In the background, once a 2xx answer reached the client in full."""
