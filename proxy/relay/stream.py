"""Copy an upstream response to the client byte for byte, optionally tapping a copy."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable

import anyio
import httpx

from proxy.relay.asgi import Send
from proxy.relay.headers import response_headers_for_client

log = logging.getLogger("memrelay.relay")


async def relay_response(
    send: Send,
    response: httpx.Response,
    extra_headers: list[tuple[bytes, bytes]],
    tap: Callable[[bytes], None] | None = None,
    deadline: float | None = None,
) -> None:
    """Stream status, end-to-end headers and raw body to the client.

    Raw means undecoded: a compressed body keeps its content-encoding and length headers.
    Past `deadline` (anyio clock) or on an upstream read error the client connection is
    aborted by raising, so a cut answer never looks complete.
    """
    headers = response_headers_for_client(response.headers.raw) + extra_headers
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    scope = anyio.CancelScope(deadline=deadline if deadline is not None else float("inf"))
    with scope:
        async for chunk in response.aiter_raw():
            if tap is not None:
                tap(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    if scope.cancelled_caught:
        raise TimeoutError("the exchange passed the total timeout mid-stream")
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class DecodingTap:
    """Decodes a gzip/deflate copy for the side parser; the client still gets raw bytes."""

    def __init__(self, encoding: str | None, sink: Callable[[bytes], None]) -> None:
        self.sink = sink
        self.supported = True
        self._decoder = None
        encoding = (encoding or "identity").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._decoder = zlib.decompressobj(wbits=47)  # auto-detects gzip and zlib headers
        elif encoding != "identity":
            self.supported = False
            log.warning("cannot parse a %s-encoded answer; exchange hook skipped", encoding)

    def __call__(self, chunk: bytes) -> None:
        if not self.supported:
            return
        if self._decoder is None:
            self.sink(chunk)
            return
        try:
            self.sink(self._decoder.decompress(chunk))
        except zlib.error:
            self.supported = False
            log.warning("undecodable compressed answer; exchange hook skipped")
