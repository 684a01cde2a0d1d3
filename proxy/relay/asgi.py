"""Small typed helpers for speaking raw ASGI, which the proxy uses instead of Response objects."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header_value(scope: Scope, name: bytes) -> bytes | None:
    """The first value of a request header (name in lower case), or None."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


async def send_bytes_response(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a whole response in one body message."""
    raw = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    raw.extend(headers or [])
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})
