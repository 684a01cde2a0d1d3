"""Reading text out of OpenAI chat messages: for the recall query and for extraction."""

from __future__ import annotations

from typing import Any

from memory_core.injection import scrub


def message_text(message: dict[str, Any]) -> str:
    """The text a message carries: string content, text parts, and tool call arguments.

    Images and audio are skipped. Echoed memory blocks are scrubbed.
    """
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            function = call.get("function") or {}
            name, arguments = function.get("name"), function.get("arguments")
            parts.append(" ".join(str(x) for x in (name, arguments) if x))
    return scrub(" ".join(p for p in parts if p).strip())


def last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return message_text(message)
    return ""


def recall_query(messages: list[Any], budget_chars: int) -> str:
    """Newest first: the last user message, then earlier turns, within `budget_chars`.

    System and developer messages are instructions, not conversation, and are left out.
    When the budget runs out the older text is cut, the newer kept.
    """
    turns = [
        m
        for m in messages
        if isinstance(m, dict) and m.get("role") in ("user", "assistant", "tool", "function")
    ]
    ordered = turns[::-1]
    for i, message in enumerate(ordered):
        if message.get("role") == "user":
            ordered.insert(0, ordered.pop(i))
            break
    pieces: list[str] = []
    used = 0
    for message in ordered:
        text = " ".join(message_text(message).split())
        if not text:
            continue
        room = budget_chars - used
        if room <= 0:
            break
        if len(text) > room:
            text = text[-room:]  # the end of a long message is its newest part
        pieces.append(text)
        used += len(text) + 1
    return "\n".join(pieces)


# What the extractor is shown beside the last exchange (issue 15): the assistant turn the
# user answered, a few earlier turns, and the spaces reconciliation may act on.
CONTEXT_TURNS = 6
CONTEXT_TURN_CHARS = 600
CONTEXT_TOTAL_CHARS = 3_000
PREVIOUS_ASSISTANT_CHARS = 2_000


def learning_context(messages: list[Any], read_spaces: list[str] | tuple[str, ...]) -> dict:
    """The job payload's `context`: earlier conversation and the request's read spaces.

    `previous_assistant` is the assistant turn just before the last user message (so
    "Munich." answers "Which city do you live in now?"); `earlier_turns` are up to
    CONTEXT_TURNS user/assistant turns before it, oldest first, each cut to its end and
    the whole bounded to CONTEXT_TOTAL_CHARS (newest kept).
    """
    turns = [m for m in messages if isinstance(m, dict) and m.get("role") in ("user", "assistant")]
    last_user = max((i for i, m in enumerate(turns) if m.get("role") == "user"), default=None)
    before = turns[:last_user] if last_user is not None else []
    previous = ""
    if before and before[-1].get("role") == "assistant":
        previous = " ".join(message_text(before.pop()).split())[-PREVIOUS_ASSISTANT_CHARS:]
    earlier: list[dict[str, str]] = []
    used = 0
    for message in reversed(before):
        text = " ".join(message_text(message).split())
        if not text:
            continue
        text = text[-CONTEXT_TURN_CHARS:]
        if len(earlier) >= CONTEXT_TURNS or used + len(text) > CONTEXT_TOTAL_CHARS:
            break
        used += len(text)
        earlier.append({"role": str(message["role"]), "text": text})
    earlier.reverse()
    return {
        "previous_assistant": previous,
        "earlier_turns": earlier,
        "read_spaces": list(read_spaces),
    }
