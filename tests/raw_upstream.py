"""A loopback HTTP/1.1 upstream on raw sockets, for transport tests.

It records each request's bytes as they arrived (header case, order, framing) and answers
with scripted bytes or misbehaviour no framework would produce: closing after the
request, a reset mid-head, a stall, a cut chunked body.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class RawRequest:
    head: bytes  # request line and headers, exactly as received
    body: bytes  # de-chunked
    raw_body: bytes  # as received
    connection: int

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        lines = self.head.split(b"\r\n")[1:]
        return [tuple(p.strip() for p in line.split(b":", 1)) for line in lines if line]  # type: ignore[misc]

    def header(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


Action = Callable[[asyncio.StreamReader, asyncio.StreamWriter, RawRequest], Awaitable[bool]]


def http_response(
    status: int = 200,
    headers: list[tuple[bytes, bytes]] | None = None,
    body: bytes = b"",
    reason: bytes = b"OK",
    length: bool = True,
) -> bytes:
    lines = [b"HTTP/1.1 %d %s" % (status, reason)]
    lines += [k + b": " + v for k, v in headers or []]
    if length:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def chunked(*parts: bytes, end: bool = True) -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return out + (b"0\r\n\r\n" if end else b"")


def answer(raw: bytes, keep: bool = True) -> Action:
    async def act(reader: Any, writer: asyncio.StreamWriter, req: RawRequest) -> bool:
        writer.write(raw)
        await writer.drain()
        return keep

    return act


async def close_after_request(reader: Any, writer: Any, req: RawRequest) -> bool:
    return False


def reset_after(raw: bytes) -> Action:
    """Write `raw`, then abort the connection with a TCP reset."""

    async def act(reader: Any, writer: asyncio.StreamWriter, req: RawRequest) -> bool:
        writer.write(raw)
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return False

    return act


def then_wait(raw: bytes, release: threading.Event, after: bytes = b"") -> Action:
    """Write `raw`, wait until the test releases it, then write `after` and close."""

    async def act(reader: Any, writer: asyncio.StreamWriter, req: RawRequest) -> bool:
        writer.write(raw)
        await writer.drain()
        await asyncio.to_thread(release.wait, 30)
        writer.write(after)
        await writer.drain()
        return False

    return act


class RawUpstream:
    """A loopback HTTP/1.1 server on raw sockets, in a thread; answers scripted actions in
    order, then `default`."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.requests: list[RawRequest] = []
        self.script: deque[Action] = deque()
        self.connections = 0
        self.closed = 0
        self.open_now = 0
        self.peak = 0
        self.loop = asyncio.new_event_loop()
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def default(self, reader: Any, writer: asyncio.StreamWriter, req: RawRequest) -> bool:
        body = b'{"id":"x","object":"chat.completion","choices":[]}'
        raw = http_response(headers=[(b"Content-Type", b"application/json")], body=body)
        if req.head.startswith(b"HEAD "):
            raw = raw[: -len(body)]
        writer.write(raw)
        await writer.drain()
        return True

    async def _read(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes, bytes] | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        lower = head.lower()
        raw = b""
        body = b""
        if b"\r\ncontent-length:" in lower:
            length = int(lower.split(b"\r\ncontent-length:", 1)[1].split(b"\r\n", 1)[0])
            raw = body = await reader.readexactly(length)
        elif b"\r\ntransfer-encoding: chunked" in lower:
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                raw += size_line + data
                body += data[:-2]
                if size == 0:
                    break
        return head[:-4], body, raw

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.open_now += 1
        self.peak = max(self.peak, self.open_now)
        try:
            while (got := await self._read(reader)) is not None:
                request = RawRequest(*got, connection=number)
                self.requests.append(request)
                action = self.script.popleft() if self.script else self.default
                if not await action(reader, writer, request):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open_now -= 1
            self.closed += 1
            writer.close()

    def __enter__(self) -> RawUpstream:
        started = threading.Event()

        async def main() -> None:
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
            self.port = self.server.sockets[0].getsockname()[1]
            started.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(main(), self.loop).result(10)
        started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
