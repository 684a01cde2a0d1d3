"""Request JSON that memrelay accepts: finite numbers, bounded nesting, sane chat shapes.

Python's json module reads `1e999` as infinity, `NaN` and `Infinity` as floats, and
raises RecursionError on very deep nesting; any of them, let through, ends as a 500 or a
row no reader can serialise. Everything here raises BadJSON with a message for a 400.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64


class BadJSON(ValueError):
    """The body is not JSON memrelay accepts; the message says why."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadJSON(f"number {text[:32]} is out of range (non-finite numbers are refused)")
    return value


def _no_constant(name: str) -> Any:
    raise BadJSON(f"{name} is not a JSON number (non-finite numbers are refused)")


def check_depth(data: Any, limit: int = MAX_DEPTH) -> None:
    """Raise BadJSON if objects and arrays nest deeper than `limit` (no recursion)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            raise BadJSON(f"JSON nests deeper than {limit} levels")
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def loads(raw: bytes | str) -> Any:
    """Parse request JSON; raises BadJSON for invalid, non-finite or too deeply nested."""
    try:
        data = json.loads(raw, parse_float=_finite, parse_constant=_no_constant)
    except BadJSON:
        raise
    except RecursionError as exc:
        raise BadJSON(f"JSON nests deeper than {MAX_DEPTH} levels") from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise BadJSON(f"request body is not valid JSON: {exc}") from exc
    if isinstance(data, (dict, list)):
        check_depth(data)
    return data


def _object_or_none(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, dict):
        raise BadJSON(f"{where} must be an object")


def check_chat_messages(messages: Any) -> None:
    """The shapes memrelay reads in `messages`; the upstream judges the rest."""
    if not isinstance(messages, list):
        raise BadJSON("'messages' is required and must be a list")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadJSON(f"{where} must be an object")
        if not isinstance(message.get("role"), str):
            raise BadJSON(f"{where}.role must be a string")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadJSON(f"{where}.content must be a string, a list of parts or null")
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            raise BadJSON(f"{where}.content parts must be objects")
        for name in ("name", "tool_call_id"):
            if name in message and not isinstance(message[name], str):
                raise BadJSON(f"{where}.{name} must be a string")
        _object_or_none(message.get("function_call"), f"{where}.function_call")
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise BadJSON(f"{where}.tool_calls must be a list")
        for j, call in enumerate(calls):
            if not isinstance(call, dict):
                raise BadJSON(f"{where}.tool_calls[{j}] must be an object")
            if "function" not in call:
                continue  # other tool types (custom tools) carry their own fields
            function = call["function"]
            if not isinstance(function, dict):
                raise BadJSON(f"{where}.tool_calls[{j}].function must be an object")
            for name in ("name", "arguments"):
                if name in function and not isinstance(function[name], str):
                    raise BadJSON(f"{where}.tool_calls[{j}].function.{name} must be a string")


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object; raises BadJSON saying what is wrong."""
    if not raw.strip():
        raise BadJSON("request body is empty; expected a JSON object")
    body = loads(raw)
    if not isinstance(body, dict):
        raise BadJSON("request body must be a JSON object")
    return body


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """A chat completion request as a dict; raises BadJSON saying what is wrong."""
    body = json_object(raw)
    check_chat_messages(body.get("messages"))
    return body
