"""Length-prefixed frames between the store and its search process: a 4-byte
big-endian length, then that many bytes (a pickle, between two processes of the same
server over an inherited socket pair: nothing else can write to it)."""

from __future__ import annotations

import asyncio
import socket
import struct

HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # a recall's results are kilobytes; more is corruption


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes is over {MAX_FRAME}")
    return HEADER.pack(len(payload)) + payload


def _size(header: bytes) -> int:
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is over {MAX_FRAME}")
    return size


def write_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(frame(payload))


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    parts: list[bytes] = []
    left = size
    while left:
        part = sock.recv(min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def read_frame(sock: socket.socket) -> bytes | None:
    """The next frame, or None at the end of the stream."""
    header = _read_exactly(sock, HEADER.size)
    if header is None:
        return None
    if (size := _size(header)) == 0:
        return b""
    body = _read_exactly(sock, size)
    if body is None:
        raise ConnectionError("the stream ended inside a frame")
    return body


async def read_frame_async(reader: asyncio.StreamReader) -> bytes:
    """The next frame; IncompleteReadError at the end of the stream."""
    size = _size(await reader.readexactly(HEADER.size))
    return await reader.readexactly(size) if size else b""
