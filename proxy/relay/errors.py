"""OpenAI-style error bodies, so clients and SDKs parse memrelay's errors like upstream ones."""

from __future__ import annotations

import json

from proxy.relay.asgi import Send, send_bytes_response


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> bytes:
    """Serialise `{"error": {...}}` the way OpenAI's API shapes it."""
    payload = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return json.dumps(payload).encode()


async def send_error(
    send: Send,
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a complete JSON error response."""
    await send_bytes_response(
        send,
        status,
        error_body(message, type_, code, param),
        content_type=b"application/json",
        headers=headers,
    )
