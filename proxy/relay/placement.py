"""Putting the memory blocks into a request: where, for each API and placement.

Chat completions (`messages`), by the `memory_placement` setting:
- `system` (default): appended to the first system or developer message (keeping its
  content type), or a new system message at index 0;
- `developer`: the same, but a new message gets the `developer` role;
- `user`: prepended to the first user message, for servers whose chat template has no
  system role (Gemma, Mistral v0.1 rendered without polyfills).
The Responses API: appended to `instructions` (see `inject_instructions` for why).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

Placement = Literal["system", "developer", "user"]
PLACEMENTS: tuple[str, ...] = ("system", "developer", "user")
SYSTEM_ROLES = ("system", "developer")


def inject(body: dict[str, Any], text: str, placement: str = "system") -> dict[str, Any]:
    """A copy of the chat request with `text` placed as `placement` says."""
    body = copy.copy(body)
    messages = list(body.get("messages") or [])
    if placement == "user" and _prepend_to_first_user(messages, text):
        body["messages"] = messages
        return body
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in SYSTEM_ROLES:
            continue
        messages[index] = _with_text(message, text, after=True)
        break
    else:
        role = "developer" if placement == "developer" else "system"
        messages.insert(0, {"role": role, "content": text})
    body["messages"] = messages
    return body


def inserts_message(body: dict[str, Any], placement: str) -> bool:
    """Whether `inject` would add a system/developer message the client did not send
    (the only case the template fallback may undo)."""
    messages = body.get("messages") or []
    if placement == "user" and any(_is_user(m) for m in messages):
        return False
    return not any(isinstance(m, dict) and m.get("role") in SYSTEM_ROLES for m in messages)


def inject_instructions(body: dict[str, Any], text: str) -> dict[str, Any]:
    """A copy of a Responses request with `text` after the client's own `instructions`.

    Why `instructions` and not a leading input item: the upstream does not carry
    `instructions` over from a `previous_response_id` (or a stored conversation), so
    each turn gets the memories recalled for it, and a memory forgotten since never
    reaches the model again through the stored conversation; an input item would be
    stored with the conversation and pile up, stale, turn after turn.
    """
    body = copy.copy(body)
    current = body.get("instructions")
    if isinstance(current, list):  # instructions given as input items
        body["instructions"] = [*current, {"type": "message", "role": "developer", "content": text}]
    elif isinstance(current, str) and current.strip():
        body["instructions"] = f"{current}\n\n{text}"
    else:
        body["instructions"] = text
    return body


def _is_user(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "user"


def _prepend_to_first_user(messages: list[Any], text: str) -> bool:
    for index, message in enumerate(messages):
        if _is_user(message):
            messages[index] = _with_text(message, text, after=False)
            return True
    return False


def _with_text(message: dict[str, Any], text: str, after: bool) -> dict[str, Any]:
    """The message with `text` added before or after its content, keeping its type."""
    message = dict(message)
    content = message.get("content")
    if isinstance(content, list):
        part = {"type": "text", "text": text}
        message["content"] = [*content, part] if after else [part, *content]
    elif isinstance(content, str) and content.strip():
        message["content"] = f"{content}\n\n{text}" if after else f"{text}\n\n{content}"
    else:
        message["content"] = text
    return message
