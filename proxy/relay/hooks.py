"""The two seams through which memory plugs into a chat completion.

`before` runs before the request leaves for the upstream and may rewrite the body or
reject the request; `after` receives the assembled exchange in the background, once the
client has its whole answer. The proxy itself knows nothing of memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.relay.exchange import Exchange
from proxy.relay.placement import inject, inject_instructions, inserts_message
from proxy.relay.responses import input_messages

CHAT_API = "chat"
RESPONSES_API = "responses"


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
    """One chat completion (or Responses API request) as it passes through the proxy."""

    request_id: str
    headers: dict[str, str]
    body: dict[str, Any]
    body_changed: bool = False
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    api: str = CHAT_API  # which body shape: chat `messages` or Responses `input`
    placement: str = "system"  # where `inject` puts memory in a chat body
    injected: str | None = None  # the memory text `inject` placed, if any
    inserted_message: bool = False  # `inject` added a system/developer message
    client_body: dict[str, Any] | None = None  # the body as the client sent it

    def set_body(self, body: dict[str, Any]) -> None:
        if self.client_body is None:
            self.client_body = self.body
        self.body = body
        self.body_changed = True

    @property
    def messages(self) -> list[Any]:
        """The conversation the client sent, as chat messages, whatever the API (memory
        memrelay placed in the body is not part of it)."""
        body = self.client_body if self.client_body is not None else self.body
        if self.api == RESPONSES_API:
            return input_messages(body)
        messages = body.get("messages")
        return messages if isinstance(messages, list) else []

    @property
    def thread(self) -> str | None:
        """The upstream-stored conversation this request continues (Responses API), or
        None: the same new input in two threads is two exchanges, not a duplicate."""
        if self.api != RESPONSES_API:
            return None
        body = self.client_body if self.client_body is not None else self.body
        ref = body.get("previous_response_id") or body.get("conversation")
        return None if ref is None else json.dumps(ref, sort_keys=True)

    def inject(self, text: str) -> None:
        """Put the memory blocks into the body where this API and placement want them."""
        body = self.client_body if self.client_body is not None else self.body
        self.injected = text
        if self.api == RESPONSES_API:
            self.set_body(inject_instructions(body, text))
            return
        self.inserted_message = inserts_message(body, self.placement)
        self.set_body(inject(body, text, self.placement))

    def reinject(self, placement: str) -> bool:
        """Move the memory to `placement` (the template fallback); False if nothing moves."""
        if self.injected is None or self.client_body is None or placement == self.placement:
            return False
        self.placement = placement
        self.inject(self.injected)
        return True

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


def wants_answer(interceptor: object, ctx: ChatContext) -> bool:
    """Whether `interceptor` needs this request's answer assembled (its optional
    `wants_answer(ctx)`; one without it always gets it). When none does, the relay
    forwards the bytes without reading them: no side parser, no exchange, no `after`."""
    wants = getattr(interceptor, "wants_answer", None)
    return True if wants is None else bool(wants(ctx))
