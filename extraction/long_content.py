"""Content longer than one memory holds: split into parts, each a memory of one source.

A memory's content is capped (MAX_CONTENT_CHARS) and the embedding model reads only
its first few hundred tokens, so a long text is cut at sentence (else word) boundaries
into parts of at most PART_CHARS characters. Every part carries the same `long_source`
provenance (an id for the whole text) and its position, so the parts can be found and
forgotten together. Parts carry no subject/attribute slot, and they are added, not
reconciled: judged against each other (they look alike), one part could supersede
another and the text would silently lose a piece. A part already stored with the same
text is not added twice.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from typing import Any

from extraction.facts import Fact
from extraction.reconcile import Outcome, Reconciler
from memory_core.model import MAX_CONTENT_CHARS, normalise_content

PART_CHARS = 2_000
MAX_LONG_CHARS = 200_000  # the admin API's limit for one request's content
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


async def apply_long(
    reconciler: Reconciler,
    tenant: str,
    space: str,
    fact: Fact,
    provenance: dict[str, Any],
    **options: Any,
) -> list[Outcome]:
    """Reconcile `fact`; when its content is too long for one memory, each part in turn
    (same kind, source, confidence, times), all under one `long_source` id."""
    if not is_long(fact.content):
        return [await reconciler.apply(tenant, space, fact, provenance, **options)]
    parts = split_text(fact.content)
    source = hashlib.sha256(normalise_content(fact.content).encode()).hexdigest()[:16]
    store = reconciler.store
    outcomes = []
    for number, part in enumerate(parts, start=1):
        piece = replace(fact, content=part, subject=None, attribute=None, value=None)
        prov = {**provenance, "long_source": source, "part": number, "parts": len(parts)}
        new = piece.to_new_memory(prov).validated()
        duplicate = await store.find_duplicate(tenant, space, new.content)
        if duplicate is not None:
            outcomes.append(Outcome("unchanged", duplicate.id, reason="same text"))
            continue
        memory = await store.add(tenant, space, new)
        outcomes.append(Outcome("added", memory.id, reason="part of a long text"))
    return outcomes
