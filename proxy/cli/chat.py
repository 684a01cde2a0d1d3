"""`memrelay chat`: a small terminal client that shows memory at work on every turn."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai


@dataclass
class Turn:
    reply: str
    recall_status: str
    memory_status: str
    injected: list[dict[str, Any]] = field(default_factory=list)


class ChatSession:
    """A conversation through memrelay; it keeps the history and asks the admin API
    what each injected memory id says."""

    def __init__(
        self,
        url: str,
        tenant: str,
        model: str,
        api_key: str | None,
        memrelay_key: str | None,
        max_tokens: int = 256,
    ) -> None:
        self.root = url.rstrip("/").removesuffix("/v1")
        headers = {"X-Memrelay-Tenant": tenant}
        if memrelay_key:
            headers["X-Memrelay-Key"] = memrelay_key
        self.client = openai.OpenAI(
            base_url=self.root + "/v1",
            api_key=api_key or "none",
            default_headers=headers,
            max_retries=1,
        )
        self.admin = httpx.Client(base_url=self.root + "/memrelay/v1", headers=headers, timeout=30)
        self.model = model
        self.max_tokens = max_tokens
        self.history: list[dict[str, str]] = []

    def send(self, text: str, on_token: Callable[[str], None] | None = None) -> Turn:
        self.history.append({"role": "user", "content": text})
        with self.client.chat.completions.with_streaming_response.create(
            model=self.model,
            messages=self.history,
            stream=True,
            max_tokens=self.max_tokens,
        ) as response:
            headers = response.headers
            parts: list[str] = []
            for chunk in response.parse():
                delta = chunk.choices[0].delta.content if chunk.choices else None
                if delta:
                    parts.append(delta)
                    if on_token:
                        on_token(delta)
        reply = "".join(parts)
        self.history.append({"role": "assistant", "content": reply})
        ids = [i for i in headers.get("x-memrelay-memory-ids", "").split(",") if i]
        injected = []
        for memory_id in ids:
            found = self.admin.get(f"/memories/{memory_id}")
            injected.append(found.json() if found.status_code == 200 else {"id": memory_id})
        return Turn(
            reply,
            headers.get("x-memrelay-recall-status", "?"),
            headers.get("x-memrelay-memory-status", "?"),
            injected,
        )

    def close(self) -> None:
        self.client.close()
        self.admin.close()
