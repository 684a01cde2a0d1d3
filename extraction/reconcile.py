"""Reconciling a new fact with what the tenant already remembers.

Mechanical first, model last: the same text reinforces; the same slot with another
value supersedes; a similar but ambiguous memory is classified by the model once;
anything else is added. A fact only the assistant stated never supersedes one the user
stated. Forget requests go through `store.forget`, the admin path; the model only
picks which candidate is meant, and an unclear pick forgets nothing.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from extraction.facts import Fact
from extraction.llm import LLMClient, LLMError
from extraction.prompts import CHOOSE_SCHEMA, CLASSIFY_SCHEMA, choose_messages, classify_messages
from memory_core.model import Memory, normalise_content
from memory_core.recall import STOPWORDS, RecallQuery
from memory_core.store import MemoryStore

log = logging.getLogger("memrelay.reconcile")

DUPLICATE_SIMILARITY = 0.95
AMBIGUOUS_SIMILARITY = 0.60


@dataclass
class Outcome:
    """What reconciliation did with one fact (or one forget request)."""

    action: str  # added, reinforced, superseded, unchanged, rejected, forgotten, not_forgotten
    memory_id: str | None = None
    old_ids: list[str] = field(default_factory=list)
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "memory_id": self.memory_id,
            "old_ids": self.old_ids,
            "reason": self.reason,
        }


@dataclass
class LLMContext:
    """Which model and credentials the reconciler may use for one job."""

    model: str | None = None
    credentials: dict[str, str] = field(default_factory=dict)


def _seen(memory: Memory, job_id: str | None) -> bool:
    return job_id is not None and any(p.get("job_id") == job_id for p in memory.provenance)


def _single_named_entity(entities: list[str]) -> str | None:
    """The subject a fact is about when its tags name exactly one person or organisation."""
    names = {
        e.split(":", 1)[1]
        for e in entities
        if ":" in e and e.split(":", 1)[0] in ("person", "organization")
    }
    return names.pop() if len(names) == 1 else None


def _words(text: str | None) -> set[str]:
    return {w for w in re.findall(r"\w+", (text or "").casefold()) if w not in STOPWORDS}


def _same_value(a: str | None, b: str | None) -> bool:
    return normalise_content(a or "").casefold() == normalise_content(b or "").casefold()


class Reconciler:
    def __init__(
        self, store: MemoryStore, llm: LLMClient | None, actor: str = "extraction"
    ) -> None:
        self.store = store
        self.llm = llm
        self.actor = actor

    async def apply(
        self,
        tenant: str,
        space: str,
        fact: Fact,
        provenance: dict[str, Any],
        llm: LLMContext | None = None,
    ) -> Outcome:
        job_id = provenance.get("job_id")
        if fact.attribute and not fact.subject:
            fact.subject = _single_named_entity(fact.entities)
        new = fact.to_new_memory(provenance).validated()
        duplicate = await self.store.find_duplicate(tenant, space, new.content)
        if duplicate is not None:
            return await self._reinforce(tenant, duplicate, provenance, job_id, "same text")
        if new.subject and new.attribute:
            for old in await self.store.find_slot(tenant, space, new.subject, new.attribute):
                if _same_value(old.value, new.value):
                    return await self._reinforce(
                        tenant, old, provenance, job_id, "same slot and value"
                    )
                return await self._supersede(tenant, old, fact, provenance, "same slot, new value")
        nearest = await self.store.nearest(tenant, space, new.content, k=3)
        if nearest:
            old, similarity = nearest[0]
            # Embeddings barely see numbers and names ("PIN 1234" vs "PIN 5678"): only
            # the same words make a duplicate; otherwise a close pair is ambiguous.
            if similarity >= DUPLICATE_SIMILARITY and _words(old.content) == _words(new.content):
                return await self._reinforce(
                    tenant, old, provenance, job_id, f"near-identical ({similarity:.2f})"
                )
            if similarity >= AMBIGUOUS_SIMILARITY and self.llm is not None:
                relation = await self._classify(old, new.content, llm)
                if relation in ("contradicts", "updates"):
                    return await self._supersede(
                        tenant, old, fact, provenance, f"model: {relation}"
                    )
        memory = await self.store.add(tenant, space, new, actor=self.actor)
        return Outcome("added", memory.id)

    async def _reinforce(
        self,
        tenant: str,
        memory: Memory,
        provenance: dict[str, Any],
        job_id: str | None,
        reason: str,
    ) -> Outcome:
        if _seen(memory, job_id):
            return Outcome("unchanged", memory.id, reason="this job was applied already")
        await self.store.reinforce(tenant, memory.id, provenance, actor=self.actor)
        return Outcome("reinforced", memory.id, reason=reason)

    async def _supersede(
        self, tenant: str, old: Memory, fact: Fact, provenance: dict[str, Any], reason: str
    ) -> Outcome:
        if fact.stated_by == "assistant" and old.source == "user":
            log.info("assistant claim not allowed to supersede user memory %s", old.id)
            return Outcome(
                "rejected", None, [old.id], "an assistant claim cannot override the user"
            )
        _, new = await self.store.supersede(
            tenant, old.id, fact.to_new_memory(provenance), reason, actor=self.actor
        )
        return Outcome("superseded", new.id, [old.id], reason)

    async def _classify(self, old: Memory, new_content: str, llm: LLMContext | None) -> str:
        assert self.llm is not None
        context = llm or LLMContext()
        try:
            answer = await self.llm.complete_json(
                classify_messages(old.content or "", new_content),
                CLASSIFY_SCHEMA,
                model=context.model,
                credentials=context.credentials,
            )
        except LLMError as exc:
            log.warning("could not classify a memory pair (%s); adding the new fact", exc)
            return "unrelated"
        relation = answer.get("relation") if isinstance(answer, dict) else None
        return (
            relation
            if relation in ("contradicts", "updates", "extends", "unrelated")
            else "unrelated"
        )

    async def forget_request(
        self, tenant: str, spaces: list[str], request: str, llm: LLMContext | None = None
    ) -> Outcome:
        """Forget the one memory a user's request clearly means, or nothing."""
        results = await self.store.recall(RecallQuery(tenant, spaces, request, top_k=5))
        candidates = [(r.memory.id, r.memory.content or "") for r in results]
        if not candidates or self.llm is None:
            return Outcome("not_forgotten", reason="no candidate memory")
        context = llm or LLMContext()
        try:
            answer = await self.llm.complete_json(
                choose_messages(request, candidates),
                CHOOSE_SCHEMA,
                model=context.model,
                credentials=context.credentials,
            )
        except LLMError as exc:
            return Outcome("not_forgotten", reason=f"model failed: {exc}")
        chosen = answer.get("memory_id") if isinstance(answer, dict) else None
        if chosen not in {memory_id for memory_id, _ in candidates}:
            return Outcome("not_forgotten", reason="ambiguous or no match")
        await self.store.forget(
            tenant, chosen, f"user asked to forget: {request[:200]}", actor=self.actor
        )
        return Outcome("forgotten", chosen)
