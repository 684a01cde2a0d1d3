"""A side parser for server-sent events: it reads a copy of the bytes the client gets.

The client's bytes are never re-serialised; this only assembles the final assistant
message (content, tool calls, refusal, finish reason, usage) for the exchange hook.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from proxy.relay.exchange import Exchange

log = logging.getLogger("memrelay.sse")


class StreamAssembler:
    """Feed raw SSE bytes in any chunking; the exchange fills in as events complete.

    Subclasses for other event shapes override `_apply` (one parsed JSON object) and
    `DONE_MARKER` (None where no `[DONE]` line ends the stream)."""

    DONE_MARKER: bytes | None = b"[DONE]"

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self._buffer = b""
        self._data: list[bytes] = []
        self.events = 0
        self.bad_events = 0

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        if b"\r" not in self._buffer:  # LF-only lines, the usual case: split in C
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                self._line(line)
            return
        while True:
            line, sep, rest = _split_line(self._buffer)
            if sep is None:
                return
            self._buffer = rest
            self._line(line)

    def close(self) -> Exchange:
        """Flush a last event the upstream did not terminate with a blank line."""
        if self._buffer:
            self._line(self._buffer)
            self._buffer = b""
        self._dispatch()
        return self.exchange

    def _line(self, line: bytes) -> None:
        if not line:
            self._dispatch()
            return
        if line.startswith(b":"):
            return  # comment / keep-alive
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value)

    def _dispatch(self) -> None:
        if not self._data:
            return
        data = b"\n".join(self._data)
        self._data = []
        self.events += 1
        if self.DONE_MARKER is not None and data.strip() == self.DONE_MARKER:
            self.exchange.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            self.bad_events += 1
            log.debug("unparseable %s event skipped", type(self).__name__)
            return
        if isinstance(chunk, dict):
            self._apply(chunk)

    def _apply(self, chunk: dict[str, Any]) -> None:
        ex = self.exchange
        ex.model = ex.model or chunk.get("model")
        ex.response_id = ex.response_id or chunk.get("id")
        if chunk.get("usage"):
            ex.usage = chunk["usage"]
        for raw in chunk.get("choices") or []:
            if not isinstance(raw, dict):
                continue
            choice = ex.choice(int(raw.get("index", 0)))
            if raw.get("finish_reason"):
                choice.finish_reason = raw["finish_reason"]
            delta = raw.get("delta") or {}
            if not isinstance(delta, dict):
                continue
            if delta.get("role"):
                choice.role = delta["role"]
            if isinstance(delta.get("content"), str):
                choice.content += delta["content"]
            if isinstance(delta.get("refusal"), str):
                choice.refusal = (choice.refusal or "") + delta["refusal"]
            for i, call in enumerate(delta.get("tool_calls") or []):
                if not isinstance(call, dict):
                    continue
                tc = choice.tool_call(int(call.get("index", i)))
                if call.get("id"):
                    tc.id = call["id"]
                if call.get("type"):
                    tc.type = call["type"]
                fn = call.get("function") or {}
                name = fn.get("name")
                # Most servers send the name once; a few repeat it whole in later deltas.
                if name and name != tc.name:
                    tc.name += name
                if isinstance(fn.get("arguments"), str):
                    tc.arguments += fn["arguments"]


_EOL = re.compile(rb"\r\n|\r|\n")


def _split_line(buffer: bytes) -> tuple[bytes, bytes | None, bytes]:
    """Split off one line ending in CRLF, LF or CR; a trailing CR waits for a possible LF."""
    match = _EOL.search(buffer)
    if match is None or (match.group() == b"\r" and match.end() == len(buffer)):
        return buffer, None, b""
    return buffer[: match.start()], match.group(), buffer[match.end() :]
