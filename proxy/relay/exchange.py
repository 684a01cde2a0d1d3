"""The assembled exchange: what a chat completion asked and what the model answered.

This is what extraction consumes. It is built the same way from a streamed answer (by
`proxy.relay.sse.StreamAssembler`) and from a plain JSON answer (by `assemble_json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class ToolCall:
    """One tool call; streamed arguments are concatenated across deltas by index."""

    index: int
    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class Choice:
    """One assembled choice of an answer (n > 1 gives several)."""

    index: int
    role: str = "assistant"
    content: str = ""
    refusal: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None

    def tool_call(self, index: int) -> ToolCall:
        for call in self.tool_calls:
            if call.index == index:
                return call
        call = ToolCall(index=index)
        self.tool_calls.append(call)
        self.tool_calls.sort(key=lambda c: c.index)
        return call


@dataclass
class Exchange:
    """A finished chat completion: request body, assembled answer, and where it came from."""

    request: dict[str, Any]
    request_headers: dict[str, str]
    status: int
    streamed: bool
    choices: list[Choice] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    model: str | None = None
    response_id: str | None = None
    done: bool = False
    request_id: str = ""

    @property
    def complete(self) -> bool:
        """True when the answer ended properly: `[DONE]` seen or every choice finished."""
        if not self.streamed:
            return True
        return self.done or (bool(self.choices) and all(c.finish_reason for c in self.choices))

    def choice(self, index: int) -> Choice:
        for choice in self.choices:
            if choice.index == index:
                return choice
        choice = Choice(index=index)
        self.choices.append(choice)
        self.choices.sort(key=lambda c: c.index)
        return choice

    def message(self, index: int = 0) -> dict[str, Any] | None:
        """The assistant message of one choice in the OpenAI message shape."""
        for choice in self.choices:
            if choice.index == index:
                msg: dict[str, Any] = {"role": choice.role, "content": choice.content or None}
                if choice.refusal:
                    msg["refusal"] = choice.refusal
                if choice.tool_calls:
                    msg["tool_calls"] = [c.as_dict() for c in choice.tool_calls]
                return msg
        return None


class ExchangeHook(Protocol):
    """Receives every successful exchange, after the client has its answer."""

    async def __call__(self, exchange: Exchange) -> None: ...


def assemble_json(exchange: Exchange, body: dict[str, Any]) -> Exchange:
    """Fill an exchange from a non-streamed chat completion JSON body."""
    exchange.model = body.get("model")
    exchange.response_id = body.get("id")
    exchange.usage = body.get("usage")
    for raw in body.get("choices") or []:
        if not isinstance(raw, dict):
            continue
        choice = exchange.choice(int(raw.get("index", len(exchange.choices))))
        message = raw.get("message") or {}
        choice.role = message.get("role") or "assistant"
        choice.content = _text(message.get("content"))
        choice.refusal = message.get("refusal")
        choice.finish_reason = raw.get("finish_reason")
        for i, call in enumerate(message.get("tool_calls") or []):
            tc = choice.tool_call(i)
            tc.id = call.get("id")
            tc.type = call.get("type") or "function"
            fn = call.get("function") or {}
            tc.name = fn.get("name") or ""
            tc.arguments = fn.get("arguments") or ""
    exchange.done = True
    return exchange


def _text(content: Any) -> str:
    """Message content as text: strings as they are, text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
