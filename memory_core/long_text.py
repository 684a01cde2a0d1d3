"""Text longer than one memory holds, cut into parts that share one source id.

A memory's content is capped (MAX_CONTENT_CHARS) and the embedding model reads only
its first few hundred tokens, so a long text is cut at sentence (else word) boundaries
into parts of at most PART_CHARS characters, all carrying one `long_source` id (a digest
of the whole text) and their position. Used by remember (extraction/long_content.py)
and by import (memory_core/transfer.py), so both cut a text the same way.
"""

from __future__ import annotations

import hashlib
import re

from memory_core.model import MAX_CONTENT_CHARS, normalise_content

PART_CHARS = 2_000
MAX_LONG_CHARS = 200_000  # the longest text accepted at all (admin API, MCP, import)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_text(text: str, limit: int = PART_CHARS) -> list[str]:
    """`text` (whitespace normalised) in parts of at most `limit` characters, cut after
    a sentence where possible, else between words, else inside a word."""
    text = normalise_content(text)
    parts: list[str] = []
    current = ""
    for piece in _pieces(text, limit):
        if current and len(current) + 1 + len(piece) > limit:
            parts.append(current)
            current = piece
        else:
            current = f"{current} {piece}" if current else piece
    if current:
        parts.append(current)
    return parts


def _pieces(text: str, limit: int) -> list[str]:
    """Sentences, with any longer than `limit` broken into words, and words into slices."""
    out: list[str] = []
    for sentence in _SENTENCE_END.split(text):
        if len(sentence) <= limit:
            out.append(sentence)
            continue
        for word in sentence.split(" "):
            out += [word[i : i + limit] for i in range(0, len(word), limit)] or [word]
    return [p for p in out if p]


def is_long(content: str) -> bool:
    return len(normalise_content(content)) > MAX_CONTENT_CHARS


def long_source(content: str) -> str:
    """The id every part of one long text shares."""
    return hashlib.sha256(normalise_content(content).encode()).hexdigest()[:16]
