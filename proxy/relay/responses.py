"""The Responses API's shapes: what memrelay accepts, and how it reads the answer.

The client's bytes are never re-serialised; these read a copy. The answer becomes an
`Exchange` with one choice (output text, refusal, function calls as tool calls), so
learning treats it as it treats a chat completion.
"""

from __future__ import annotations

import logging
from typing import Any

from proxy.relay.exchange import Exchange
from proxy.relay.json_input import BadJSON, json_object
from proxy.relay.sse import StreamAssembler

log = logging.getLogger("memrelay.responses")

# An answer that ended: `incomplete` (max_output_tokens) still holds what the model said,
# as a chat completion cut by `length` does; `failed` and `cancelled` do not count.
ENDED = frozenset({"completed", "incomplete"})
ENDED_EVENTS = frozenset({"response.completed", "response.incomplete"})


def parse_responses_body(raw: bytes) -> dict[str, Any]:
    """A Responses request as a dict; raises BadJSON for the shapes memrelay reads."""
    body = json_object(raw)
    items = body.get("input")
    if items is not None and not isinstance(items, (str, list)):
        raise BadJSON("'input' must be a string or a list of items")
    for i, item in enumerate(items if isinstance(items, list) else []):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadJSON(f"{where} must be an object")
        content = item.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadJSON(f"{where}.content must be a string, a list of parts or null")
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            raise BadJSON(f"{where}.content parts must be objects")
        if "role" in item and not isinstance(item["role"], str):
            raise BadJSON(f"{where}.role must be a string")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, (str, list)):
        raise BadJSON("'instructions' must be a string, a list of items or null")
    return body


def apply_output(exchange: Exchange, response: dict[str, Any]) -> None:
    """Fill the exchange's one choice from a response object's `output` items."""
    exchange.model = response.get("model") or exchange.model
    exchange.response_id = response.get("id") or exchange.response_id
    if isinstance(response.get("usage"), dict):
        exchange.usage = response["usage"]
    items = response.get("output")
    if not isinstance(items, list):
        return
    exchange.choices = []
    choice = exchange.choice(0)
    texts: list[str] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                    choice.refusal = (choice.refusal or "") + part["refusal"]
        elif kind == "function_call":
            call = choice.tool_call(len(choice.tool_calls))
            call.id = item.get("call_id") or item.get("id")
            call.name = str(item.get("name") or "")
            call.arguments = str(item.get("arguments") or "")
    choice.content = "".join(texts)
    choice.finish_reason = str(response.get("status") or "") or None


def assemble_response(exchange: Exchange, body: dict[str, Any]) -> Exchange | None:
    """A non-streamed response object as an exchange; None if it did not end."""
    if body.get("status") not in ENDED:
        return None
    apply_output(exchange, body)
    exchange.done = True
    return exchange


class ResponsesStreamAssembler(StreamAssembler):
    """Reads the typed event stream (`event:` lines are ignored: each data object
    carries its `type`). Output items are kept as they finish; the final
    `response.completed` (or `.incomplete`) event's full response wins when it has them.
    `done` is only set by that final event, so a failed or cut stream is never learned."""

    DONE_MARKER = None  # the stream ends with `response.completed`, never `[DONE]`

    def __init__(self, exchange: Exchange) -> None:
        super().__init__(exchange)
        self.items: dict[int, dict[str, Any]] = {}

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        response = event.get("response")
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self.items[int(event.get("output_index", len(self.items)))] = event["item"]
        elif kind in ENDED_EVENTS and isinstance(response, dict):
            if not response.get("output") and self.items:
                response = {**response, "output": [self.items[i] for i in sorted(self.items)]}
            apply_output(self.exchange, response)
            self.exchange.done = True
        elif isinstance(response, dict):  # created / in_progress: the id and model
            self.exchange.model = self.exchange.model or response.get("model")
            self.exchange.response_id = self.exchange.response_id or response.get("id")


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses API request's `input` as chat messages, for recall and learning.

    A string is one user message; message items keep their role and content (input_text
    and output_text parts are read by the memory layer); a function call becomes an
    assistant tool call and its output a tool message; other items (reasoning, item
    references, images, files) carry no text memrelay reads. Only the new input is
    here: turns stored upstream under `previous_response_id` are not.
    """
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        return []
    messages: list[dict[str, Any]] = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message" and isinstance(item.get("role"), str):
            messages.append({"role": item["role"], "content": item.get("content")})
        elif kind == "function_call":
            name, arguments = item.get("name"), item.get("arguments")
            call = {"name": name if isinstance(name, str) else ""}
            call["arguments"] = arguments if isinstance(arguments, str) else ""
            messages.append(
                {"role": "assistant", "content": None, "tool_calls": [{"function": call}]}
            )
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {"role": "tool", "content": output if isinstance(output, (str, list)) else ""}
            )
    return messages
