"""A transparent recording hop between memrelay and a real server: it keeps every
request body it forwards, so tests can see exactly what llama.cpp received."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx


class RecordingForwarder:
    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/").removesuffix("/v1")
        self.bodies: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()

    def chat_bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(b) for p, b in self.bodies if p == "/v1/chat/completions"]

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].replace("lifespan.", "")
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        with self.lock:
            self.bodies.append((scope["path"], body))
        headers = [
            (k, v) for k, v in scope["headers"] if k.lower() not in (b"host", b"content-length")
        ]
        url = (
            self.target
            + scope["path"]
            + ("?" + scope["query_string"].decode() if scope["query_string"] else "")
        )
        async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
            request = client.build_request(scope["method"], url, headers=headers, content=body)
            response = await client.send(request, stream=True)
            keep = [
                (k, v)
                for k, v in response.headers.raw
                if k.lower() not in (b"transfer-encoding", b"connection", b"content-length")
            ]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": keep}
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            await response.aclose()
