"""Tolerant reading of JSON from model output: code fences, think blocks, trailing prose."""

from __future__ import annotations

import json
import re
from typing import Any

_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


class NoJSON(ValueError):
    """The text holds no JSON object or array."""


def parse_json(text: str) -> Any:
    """The first JSON object or array in `text`, however it is wrapped."""
    text = _THINK.sub("", text or "").strip()
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        candidate = candidate.strip()
        try:
            return json.loads(candidate)
        except ValueError:
            pass
        for start, ch in enumerate(candidate):
            if ch in "{[":
                try:
                    value, _ = decoder.raw_decode(candidate, start)
                except ValueError:
                    continue
                return value
    raise NoJSON(f"no JSON found in model output: {text[:200]!r}")
