"""Putting memory blocks into ONE system-level message of a chat request."""

from __future__ import annotations

import copy
from typing import Any


def inject(body: dict[str, Any], text: str) -> dict[str, Any]:
    """A copy of the request with `text` appended to the first system or developer
    message (keeping its content type), or a new system message at index 0."""
    body = copy.copy(body)
    messages = list(body.get("messages") or [])
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            continue
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = [*content, {"type": "text", "text": text}]
        elif isinstance(content, str) and content.strip():
            message["content"] = f"{content}\n\n{text}"
        else:
            message["content"] = text
        messages[index] = message
        break
    else:
        messages.insert(0, {"role": "system", "content": text})
    body["messages"] = messages
    return body
