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

from dataclasses import replace
from typing import Any

from extraction.facts import Fact
from extraction.reconcile import Outcome, Reconciler
from memory_core.long_text import (  # the splitter lives in memory_core: import uses it too
    MAX_LONG_CHARS,
    PART_CHARS,
    is_long,
    long_source,
    split_text,
)

__all__ = ["MAX_LONG_CHARS", "PART_CHARS", "apply_long", "is_long", "split_text"]


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
    source = long_source(fact.content)
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
