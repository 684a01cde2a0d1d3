"""A scriptable, recording fake of an OpenAI-compatible server, served for real by uvicorn.

Tests queue replies (`fake.script.append(Reply.sse(...))`); every request is recorded
with its raw headers and body, every byte sent is kept, and a client that goes away is
noticed (`fake.disconnected.wait(1)`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.decode().lower() == name.lower():
                return value.decode("latin-1")
        return None

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    """One scripted answer."""

    kind: str = "json"
    status: int = 200
    body: bytes = b""
    chunks: list[bytes] = field(default_factory=list)
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    delay: float = 0.0
    first_delay: float = 0.0
    content_type: bytes = b"application/json"

    @classmethod
    def json(cls, payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
        return cls("json", status, json.dumps(payload).encode(), headers=_h(headers))

    @classmethod
    def raw(
        cls,
        body: bytes,
        status: int = 200,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        first_delay: float = 0.0,
    ) -> Reply:
        return cls(
            "json",
            status,
            body,
            headers=_h(headers),
            content_type=content_type.encode(),
            first_delay=first_delay,
        )

    @classmethod
    def sse(
        cls,
        chunks: list[bytes],
        delay: float = 0.0,
        first_delay: float = 0.0,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        return cls(
            "sse",
            200,
            chunks=chunks,
            delay=delay,
            first_delay=first_delay,
            headers=_h(headers),
            content_type=b"text/event-stream",
        )

    @classmethod
    def hang(cls) -> Reply:
        """Never answer; wait until the client goes away."""
        return cls("hang")

    @classmethod
    def cut(cls, chunks: list[bytes]) -> Reply:
        """Send some SSE chunks, then drop the connection mid-stream."""
        return cls("cut", 200, chunks=chunks, content_type=b"text/event-stream")


def _h(headers: dict[str, str] | None) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]


def sse_event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def chat_chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> bytes:
    return sse_event(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "fake-model",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
        }
    )


def completion(content: str = "Hello from fake.", **message: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }


def default_stream(text: str = "Hello from fake.") -> list[bytes]:
    words = text.split(" ")
    chunks = [chat_chunk({"role": "assistant", "content": ""})]
    chunks += [chat_chunk({"content": (" " if i else "") + w}) for i, w in enumerate(words)]
    chunks.append(chat_chunk({}, finish="stop"))
    chunks.append(b"data: [DONE]\n\n")
    return chunks


def response_object(
    text: str = "Hello from fake.",
    calls: list[dict[str, str]] | None = None,
    status: str = "completed",
    response_id: str = "resp_fake",
) -> dict[str, Any]:
    """A Responses API answer: one output_text message, then any function calls
    (`{"name", "arguments", "call_id"}`)."""
    output: list[dict[str, Any]] = []
    if text:
        output.append(_message_item(text))
    for i, call in enumerate(calls or []):
        output.append(_call_item(call, i))
    return {
        "id": response_id,
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "fake-model",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 3,
            "output_tokens": 4,
            "total_tokens": 7,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if text else []
    return {
        "id": "msg_fake",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _call_item(call: dict[str, str], i: int, arguments: str | None = None) -> dict[str, Any]:
    return {
        "id": f"fc_fake{i}",
        "type": "function_call",
        "status": "completed" if arguments is None else "in_progress",
        "call_id": call.get("call_id", f"call_{i}"),
        "name": call["name"],
        "arguments": call["arguments"] if arguments is None else arguments,
    }


def typed_event(payload: dict[str, Any]) -> bytes:
    """One Responses API event, as OpenAI sends it: a typed `event:` line, then data."""
    data = json.dumps(payload, ensure_ascii=False).encode()
    return b"event: " + payload["type"].encode() + b"\ndata: " + data + b"\n\n"


def responses_stream(
    text: str = "Hello from fake.",
    calls: list[dict[str, str]] | None = None,
    end: str = "response.completed",
    response_id: str = "resp_fake",
) -> list[bytes]:
    """The event stream of `response_object(text, calls)`, word by word; `end` may be
    `response.failed` or `response.incomplete`."""
    final = response_object(text, calls, end.rsplit(".", 1)[1], response_id)
    if end == "response.failed":
        final["error"] = {"code": "server_error", "message": "the model failed"}
    started = {**final, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    index = 0
    if text:
        where = {"item_id": "msg_fake", "output_index": 0, "content_index": 0}
        empty = {"type": "output_text", "text": "", "annotations": []}
        events.append(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": _message_item("", "in_progress"),
            }
        )
        events.append({"type": "response.content_part.added", **where, "part": empty})
        for i, word in enumerate(text.split(" ")):
            delta = (" " if i else "") + word
            events.append(
                {"type": "response.output_text.delta", **where, "delta": delta, "logprobs": []}
            )
        events.append({"type": "response.output_text.done", **where, "text": text, "logprobs": []})
        part = {"type": "output_text", "text": text, "annotations": []}
        events.append({"type": "response.content_part.done", **where, "part": part})
        events.append(
            {"type": "response.output_item.done", "output_index": 0, "item": _message_item(text)}
        )
        index = 1
    for i, call in enumerate(calls or []):
        at = index + i
        item_id = f"fc_fake{i}"
        added = _call_item(call, i, arguments="")
        events.append({"type": "response.output_item.added", "output_index": at, "item": added})
        events.append(
            {
                "type": "response.function_call_arguments.delta",
                "item_id": item_id,
                "output_index": at,
                "delta": call["arguments"],
            }
        )
        events.append(
            {
                "type": "response.function_call_arguments.done",
                "item_id": item_id,
                "output_index": at,
                "arguments": call["arguments"],
            }
        )
        events.append(
            {"type": "response.output_item.done", "output_index": at, "item": _call_item(call, i)}
        )
    events.append({"type": end, "response": final})
    return [typed_event({**e, "sequence_number": n}) for n, e in enumerate(events)]


class FakeUpstream:
    """ASGI app. Thread-safe enough for tests: mutate `script` before requests."""

    def __init__(self) -> None:
        self.script: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self.sent: list[bytes] = []
        self.disconnected = threading.Event()
        self.disconnected_at: float | None = None
        self.lock = threading.Lock()
        self.responder: Any = None  # optional callable(Recorded) -> Reply | None

    def reset(self) -> None:
        with self.lock:
            self.script.clear()
            self.requests.clear()
            self.sent.clear()
            self.disconnected.clear()
            self.disconnected_at = None
            self.responder = None

    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path == "/v1/chat/completions"]

    def responses_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path == "/v1/responses"]

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._mark_disconnect()
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        recorded = Recorded(
            scope["method"],
            scope["path"],
            scope.get("query_string", b""),
            list(scope["headers"]),
            body,
        )
        with self.lock:
            self.requests.append(recorded)
            reply = self.script.popleft() if self.script else None
        if reply is None and self.responder is not None:
            reply = self.responder(recorded)
        if reply is None:
            reply = self._default(recorded)
        gone = asyncio.Event()  # this request's client hung up (others may still be here)
        watcher = asyncio.ensure_future(self._watch(receive, gone))
        try:
            await self._play(reply, send, gone)
        finally:
            if reply.kind != "hang":
                watcher.cancel()
            else:
                await watcher

    def _mark_disconnect(self) -> None:
        self.disconnected_at = time.monotonic()
        self.disconnected.set()

    async def _watch(self, receive: Any, gone: asyncio.Event) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
                self._mark_disconnect()
                return

    def _default(self, req: Recorded) -> Reply:
        if req.path == "/v1/models":
            return Reply.json({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        if req.path == "/v1/chat/completions" and b"memrelay-extraction" in req.body:
            return Reply.json(completion(json.dumps({"facts": [], "forget": []})))
        if req.path in ("/v1/chat/completions", "/v1/responses") and req.method == "POST":
            try:
                stream = bool(json.loads(req.body).get("stream"))
            except ValueError:
                stream = False
            if req.path == "/v1/responses":
                return Reply.sse(responses_stream()) if stream else Reply.json(response_object())
            return Reply.sse(default_stream()) if stream else Reply.json(completion())
        return Reply.json({"echo": req.path, "method": req.method, "size": len(req.body)})

    async def _play(self, reply: Reply, send: Any, gone: asyncio.Event) -> None:
        if reply.kind == "hang":
            return  # the caller waits for the client to go away
        if reply.first_delay:
            for _ in range(int(reply.first_delay / 0.01)):
                if gone.is_set():
                    return
                await asyncio.sleep(0.01)
        headers = [(b"content-type", reply.content_type), *reply.headers]
        if reply.kind == "json":
            if not any(k == b"content-length" for k, _ in reply.headers):
                headers.append((b"content-length", str(len(reply.body)).encode()))
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            await send({"type": "http.response.body", "body": reply.body})
            self.sent.append(reply.body)
            return
        headers.append((b"cache-control", b"no-cache"))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        sent = bytearray()
        for i, chunk in enumerate(reply.chunks):
            if i and reply.delay:
                await asyncio.sleep(reply.delay)
            if gone.is_set():
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            sent.extend(chunk)
        self.sent.append(bytes(sent))
        if reply.kind == "cut":
            raise ConnectionAbortedError("scripted cut mid-stream")
        await send({"type": "http.response.body", "body": b""})
