"""The client side of a proxied request: its body, and noticing when it goes away.

One pump task owns `receive()`: it hands request body chunks to the handler through a
small bounded stream (back-pressure for large uploads) and, once the body is complete,
keeps listening so that an `http.disconnect` cancels the handler, and with it the
upstream request, at once: before the first byte, mid-stream, or for a plain JSON answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from proxy.relay.asgi import Receive


class BodyTooLarge(Exception):
    """The request body exceeded the configured limit."""


class Downstream:
    """Body chunks and disconnect state of one request."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        send: MemoryObjectSendStream[bytes]
        recv: MemoryObjectReceiveStream[bytes]
        send, recv = anyio.create_memory_object_stream[bytes](4)
        self._body_send = send
        self._body_recv = recv
        self.disconnected = False

    async def _pump(self, scope: anyio.CancelScope) -> None:
        body_open = True
        try:
            while True:
                message = await self._receive()
                kind = message.get("type")
                if kind == "http.request" and body_open:
                    chunk = message.get("body", b"")
                    if chunk:
                        await self._body_send.send(chunk)
                    if not message.get("more_body", False):
                        body_open = False
                        self._body_send.close()
                elif kind == "http.disconnect":
                    self.disconnected = True
                    scope.cancel()
                    return
        finally:
            self._body_send.close()

    async def body_chunks(self) -> AsyncIterator[bytes]:
        """The request body as it arrives."""
        async for chunk in self._body_recv:
            yield chunk

    async def read_body(self, limit: int) -> bytes:
        """The whole body, or BodyTooLarge once it passes `limit` bytes."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.body_chunks():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(size)
            parts.append(chunk)
        return b"".join(parts)

    async def read_prefix(self, limit: int) -> tuple[bytes, bool]:
        """Up to about `limit` bytes of body, and whether that was the whole body."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.body_chunks():
            parts.append(chunk)
            size += len(chunk)
            if size >= limit:
                return b"".join(parts), False
        return b"".join(parts), True

    async def rest(self, prefix: bytes) -> AsyncIterator[bytes]:
        """The body from `prefix` on, as a stream for the upstream client."""
        if prefix:
            yield prefix
        async for chunk in self._body_recv:
            yield chunk

    async def run(self, handler: Callable[[], Awaitable[None]]) -> None:
        """Run `handler` until it returns or the client disconnects, whichever is first."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._pump, tg.cancel_scope)
            await handler()
            tg.cancel_scope.cancel()
