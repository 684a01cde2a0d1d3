"""Reconciling new facts with what the tenant already remembers: the rules, in one place.

A fact is compared with the active memories of EVERY space the request can read (the
write space first), never only the nearest one:
1. Same text in a readable space: reinforce it.
2. What the extractor proposed against the memories it was shown (short ids m1, m2...):
   "same" reinforces that memory, "update" supersedes every memory listed. Ids it was
   not shown are ignored.
3. Same slot (subject + attribute) in a readable space: the same value reinforces, any
   other value supersedes, for every memory in that slot.
4. Only when the extractor did not say (no "action"): every active memory within
   JUDGE_SIMILARITY is judged by the model in one call ("same", "updates",
   "contradicts", "extends", "unrelated"); near-identical words count as "same".
5. Then: if some memory says the same thing it is reinforced and the replaced ones are
   superseded by it; else the fact is stored once and supersedes every replaced memory
   (in the space of the first one it replaces, else in the write space).
Guards, whatever the model says:
- an assistant's claim never supersedes or retires a memory the user (or an admin)
  stated: the whole fact is rejected;
- a fact the user states or confirms that repeats an assistant's memory makes that
  memory the user's (`source` becomes `user`);
- reinforcing twice from one job changes nothing (a retried job is idempotent).
Retiring ("delete": no longer true, nothing replaces it) sets `expired`. Forgetting goes
through `store.forget`, which also erases every version the memory superseded; what a
forget in words reaches is extraction/forget_words.py. Reasons written to memories and
events are fixed text plus ids, never the user's words.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from extraction.facts import Fact
from extraction.forget_words import WordForgetter
from extraction.llm import LLMClient, LLMError
from extraction.outcome import LLMContext, Outcome
from extraction.prompts import CLASSIFY_SCHEMA, RELATIONS, classify_messages
from memory_core.errors import InvalidTransition, NotFound
from memory_core.model import Memory, normalise_content
from memory_core.recall import STOPWORDS, RecallQuery

log = logging.getLogger("memrelay.reconcile")

DUPLICATE_SIMILARITY = 0.95  # with the same words: the same fact
JUDGE_SIMILARITY = 0.60  # closer than this: the judge is asked (when the extractor did not say)
JUDGE_CANDIDATES = 5
RELATED_SIMILARITY = 0.20  # shown to the extractor: recall hits at least this close
RELATED_TOP_K = 10
NEIGHBOUR_SEEDS = 3  # the best related memories whose own neighbours are shown too
NEIGHBOURS = 4
SEED_SIMILARITY = 0.35  # only a clearly related memory's neighbours (each costs a recall)
NEIGHBOUR_SIMILARITY = 0.40
RELATED_MAX = 16
SOURCE_RANK = {"assistant": 0, "user": 1, "import": 1, "admin": 2}
FORGET_REASON = "forgotten at the user's request in a chat"
RETIRE_REASON = "no longer true, said in a chat"


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


def _unique(memories: list[Memory]) -> list[Memory]:
    seen: set[str] = set()
    return [m for m in memories if not (m.id in seen or seen.add(m.id))]


class Reconciler:
    def __init__(
        self, store: Any, llm: LLMClient | None, actor: str = "extraction", jobs: Any = None
    ) -> None:
        self.store = store
        self.llm = llm
        self.actor = actor
        # jobs: the queue (`JobQueue`), for a forget in words to erase dead jobs' text
        self.words = WordForgetter(store, llm, jobs, self.forget_memory)

    # -- facts ----------------------------------------------------------------------

    async def apply(
        self,
        tenant: str,
        space: str,
        fact: Fact,
        provenance: dict[str, Any],
        llm: LLMContext | None = None,
        *,
        spaces: list[str] | None = None,
        shown: dict[str, Memory] | None = None,
    ) -> Outcome:
        """Reconcile one fact; `space` is where a new memory goes, `spaces` (with it)
        every space the request can read, `shown` what the extractor was shown."""
        spaces = list(dict.fromkeys([space, *(spaces or [])]))
        if fact.attribute and not fact.subject:
            fact.subject = _single_named_entity(fact.entities)
        new = fact.to_new_memory(provenance).validated()
        for each in spaces:  # rule 1
            duplicate = await self.store.find_duplicate(tenant, each, new.content)
            if duplicate is not None:
                return await self._reinforce(tenant, duplicate, [], fact, provenance, "same text")
        same: list[Memory] = []
        replace: list[Memory] = []
        why: dict[str, str] = {}  # replaced memory id -> the rule that replaced it

        def replaced(memories: list[Memory], reason: str) -> None:
            replace.extend(memories)
            for memory in memories:
                why.setdefault(memory.id, reason)

        targets = [shown[i] for i in fact.memory_ids if shown and i in shown]  # rule 2
        if fact.action == "same" and targets:
            same.append(targets[0])
        elif fact.action == "update":
            replaced(targets, "updated, said the extractor")
        if new.subject and new.attribute:  # rule 3
            for each in spaces:
                for old in await self.store.find_slot(tenant, each, new.subject, new.attribute):
                    if _same_value(old.value, new.value):
                        same.append(old)
                    else:
                        replaced([old], "same slot, new value")
        if fact.action is None and not same:  # rule 4
            judged_same, judged = await self._judge(tenant, spaces, new.content, llm)
            same += judged_same
            for memory, relation in judged:
                replaced([memory], f"model: {relation}")
        same = await self._current(tenant, same)
        replace = [m for m in await self._current(tenant, replace) if m not in same[:1]]
        reason = why[replace[0].id] if replace else ""
        return await self._settle(tenant, space, fact, provenance, same, replace, reason)

    async def _settle(
        self,
        tenant: str,
        space: str,
        fact: Fact,
        provenance: dict[str, Any],
        same: list[Memory],
        replace: list[Memory],
        reason: str,
    ) -> Outcome:
        """Rule 5 and the guards."""
        if replace and fact.stated_by == "assistant":
            protected = [m for m in replace if SOURCE_RANK.get(m.source, 1) > 0]
            if protected:
                log.info("assistant claim not allowed to supersede %d memories", len(protected))
                return Outcome(
                    "rejected",
                    None,
                    [m.id for m in protected],
                    "an assistant claim cannot override the user",
                    {m.id: m.space for m in protected},
                )
        if same:
            return await self._reinforce(
                tenant, same[0], replace, fact, provenance, reason or "same fact"
            )
        if not replace:
            memory = await self.store.add(
                tenant, space, fact.to_new_memory(provenance), actor=self.actor
            )
            return Outcome("added", memory.id, spaces={memory.id: memory.space})
        reason = reason or "replaced by a newer fact"
        first, *others = replace
        _, new = await self.store.supersede(
            tenant, first.id, fact.to_new_memory(provenance), reason, actor=self.actor
        )
        await self._supersede_by(tenant, others, new.id, reason)
        spaces = {m.id: m.space for m in replace} | {new.id: new.space}
        return Outcome("superseded", new.id, [m.id for m in replace], reason, spaces)

    async def _reinforce(
        self,
        tenant: str,
        memory: Memory,
        replace: list[Memory],
        fact: Fact,
        provenance: dict[str, Any],
        reason: str,
    ) -> Outcome:
        spaces = {m.id: m.space for m in [memory, *replace]}
        old_ids = [m.id for m in replace]
        if _seen(memory, provenance.get("job_id")):
            return Outcome("unchanged", memory.id, old_ids, "this job was applied already", spaces)
        await self.store.reinforce(
            tenant, memory.id, {**provenance, "stated_by": fact.stated_by}, actor=self.actor
        )
        await self._supersede_by(tenant, replace, memory.id, "replaced by a repeated fact")
        return Outcome("reinforced", memory.id, old_ids, reason, spaces)

    async def _supersede_by(
        self, tenant: str, olds: list[Memory], memory_id: str, reason: str
    ) -> None:
        for old in olds:
            try:
                await self.store.supersede(tenant, old.id, memory_id, reason, actor=self.actor)
            except (InvalidTransition, NotFound):
                log.info("memory %s changed meanwhile; not superseded", old.id)

    async def _current(self, tenant: str, memories: list[Memory]) -> list[Memory]:
        """The same memories as they are now, active ones only (another fact of the same
        job may have superseded one already)."""
        out = []
        for memory in _unique(memories):
            now = await self.store.get(tenant, memory.id)
            if now is not None and now.status == "active":
                out.append(now)
        return out

    async def _judge(
        self, tenant: str, spaces: list[str], content: str, llm: LLMContext | None
    ) -> tuple[list[Memory], list[tuple[Memory, str]]]:
        """Close memories the new fact repeats, and those it replaces with why (rule 4)."""
        query = RecallQuery(
            tenant, spaces, content, top_k=JUDGE_CANDIDATES, use_text=False, background=True
        )
        close = [
            (r.memory, r.breakdown.get("vector_similarity", 0.0))
            for r in await self.store.recall(query)
        ]
        close = [(m, s) for m, s in close if s >= JUDGE_SIMILARITY]
        # Embeddings barely see numbers and names ("PIN 1234" vs "PIN 5678"): only the
        # same words make a duplicate; otherwise a close pair is for the judge.
        same = [
            m
            for m, s in close
            if s >= DUPLICATE_SIMILARITY and _words(m.content) == _words(content)
        ]
        if same:
            return same[:1], []
        if not close or self.llm is None:
            return [], []
        candidates = {f"m{i}": m for i, (m, _) in enumerate(close, start=1)}
        verdicts = await self._verdicts(candidates, content, llm)
        same = [candidates[i] for i, r in verdicts.items() if r == "same"]
        replace = [
            (candidates[i], r) for i, r in verdicts.items() if r in ("updates", "contradicts")
        ]
        return same[:1], replace

    async def _verdicts(
        self, candidates: dict[str, Memory], content: str, llm: LLMContext | None
    ) -> dict[str, str]:
        assert self.llm is not None
        context = llm or LLMContext()
        texts = {short_id: m.content or "" for short_id, m in candidates.items()}
        try:
            answer = await self.llm.complete_json(
                classify_messages(texts, content),
                CLASSIFY_SCHEMA,
                model=context.model,
                credentials=context.credentials,
            )
        except LLMError as exc:
            log.warning("could not judge %d memories (%s); adding the new fact", len(texts), exc)
            return {}
        if not isinstance(answer, dict):
            return {}
        if "relation" in answer and len(texts) == 1:  # a single-pair answer
            answer = {"verdicts": [{"id": next(iter(texts)), "relation": answer["relation"]}]}
        out: dict[str, str] = {}
        for item in answer.get("verdicts") or []:
            if isinstance(item, dict) and item.get("id") in texts:
                relation = item.get("relation")
                out[item["id"]] = relation if relation in RELATIONS else "unrelated"
        return out

    # -- what the extractor is shown ------------------------------------------------

    async def related(self, tenant: str, spaces: list[str], text: str) -> dict[str, Memory]:
        """Active memories of the readable spaces related to `text`, under short ids.

        Those recalled for the text itself, then the close neighbours of the best few:
        "I quit nursing" barely resembles "works night shifts", but "works as a nurse"
        does, and a change of job may end both."""
        results = await self.store.recall(
            RecallQuery(
                tenant,
                spaces,
                text,
                top_k=RELATED_TOP_K,
                min_similarity=RELATED_SIMILARITY,
                background=True,
            )
        )
        found = {r.memory.id: r.memory for r in results}
        seeds = [
            r.memory
            for r in results[:NEIGHBOUR_SEEDS]
            if r.breakdown.get("vector_similarity", 0.0) >= SEED_SIMILARITY
        ]
        for seed in seeds:
            query = RecallQuery(
                tenant,
                spaces,
                seed.content or "",
                top_k=NEIGHBOURS,
                min_similarity=NEIGHBOUR_SIMILARITY,
                use_text=False,
                background=True,
            )
            for r in await self.store.recall(query):
                if len(found) >= RELATED_MAX:
                    break
                found.setdefault(r.memory.id, r.memory)
        return {f"m{i}": memory for i, memory in enumerate(found.values(), start=1)}

    # -- retire and forget -----------------------------------------------------------

    async def retire(
        self, tenant: str, memory: Memory, job_id: str | None, stated_by: str = "user"
    ) -> Outcome:
        """A shown memory the user says is no longer (or never was) true: `expired`."""
        spaces = {memory.id: memory.space}
        if stated_by == "assistant" and SOURCE_RANK.get(memory.source, 1) > 0:
            return Outcome(
                "rejected", None, [memory.id], "an assistant claim cannot override the user", spaces
            )
        reason = RETIRE_REASON + (f" (job {job_id})" if job_id else "")
        try:
            await self.store.retire(tenant, memory.id, reason, actor=self.actor)
        except (InvalidTransition, NotFound):
            return Outcome("unchanged", memory.id, reason="not active any more", spaces=spaces)
        return Outcome("retired", None, [memory.id], RETIRE_REASON, spaces)

    async def forget_memory(self, tenant: str, memory: Memory, job_id: str | None) -> Outcome:
        """Forget one memory (and the versions it superseded); fixed reason, no words."""
        spaces = {memory.id: memory.space}
        reason = FORGET_REASON + (f" (job {job_id})" if job_id else "")
        try:
            await self.store.forget(tenant, memory.id, reason, actor=self.actor)
        except (InvalidTransition, NotFound):
            return Outcome("not_forgotten", None, [memory.id], "already forgotten", spaces)
        return Outcome("forgotten", None, [memory.id], FORGET_REASON, spaces)

    async def forget_request(
        self,
        tenant: str,
        spaces: list[str],
        request: str,
        llm: LLMContext | None = None,
        job_id: str | None = None,
    ) -> list[Outcome]:
        """Forget what a request in the user's words means, or nothing: every memory
        holding all its words, else the one the model picks (extraction/forget_words.py)."""
        return await self.words.forget(tenant, spaces, request, llm, job_id)
