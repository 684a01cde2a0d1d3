"""A forget request in the user's words ("forget my locker code"): what it reaches.

Apart from reconciliation proper because a forget in words is not matched like a fact:
- every active memory of the readable spaces holding all its words (folded, Porter
  stems, filler dropped) is forgotten, however it ranks: those recalled, then every one
  the store's full-text sweep finds (`text_matches`), so a large tenant keeps no match;
- the dead jobs of those spaces whose text holds the same words lose it first, since
  retrying one would learn the forgotten fact again;
- only when no memory holds them all may the model pick the one it clearly means.
The job holding the request has waited for every earlier job of its tenant (the queue's
`forgets` rule, memory_core/jobs.py), so nothing queued before it is learned after it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import snowballstemmer

from extraction.llm import LLMClient, LLMError
from extraction.outcome import LLMContext, Outcome
from extraction.prompts import CHOOSE_SCHEMA, choose_messages
from memory_core.model import Memory
from memory_core.recall import STOPWORDS, RecallQuery, fold

log = logging.getLogger("memrelay.reconcile")

FORGET_MAX = 10  # recalled for a forget request; what the model may choose from
FORGET_PAGE = 500  # memories holding every word, read per page of the full-text sweep
# Words that never identify what to forget ("forget my old address" -> old, address).
FORGET_FILLER = frozenset(
    "my mine me i i'm about what said told you everything all please that thing things"
    " mein meine meinen meiner dass alles mon ma mes que tout mi mis todo meu minha meus"
    " minhas tudo".split()
)
_STEMMER = snowballstemmer.stemmer("porter")

ForgetOne = Callable[[str, Memory, str | None], Awaitable[Outcome]]


def stems(text: str | None, drop: frozenset[str] = frozenset()) -> set[str]:
    """Folded, stemmed content words: "The user's addresses" -> {user, address}."""
    words = re.findall(r"\w+", fold(text or ""))
    return {_STEMMER.stemWord(w) for w in words if w not in STOPWORDS and w not in drop}


def payload_text(payload: dict[str, Any]) -> str:
    """What a job learns from: the exchange and the turns before it (`exchange_input`)."""
    context = payload.get("context") or {}
    turns = [t.get("text") for t in context.get("earlier_turns") or [] if isinstance(t, dict)]
    parts = [payload.get("user"), payload.get("assistant"), context.get("previous_assistant")]
    return "\n".join(str(p) for p in [*parts, *turns] if p)


class WordForgetter:
    """Forgets by words on the reconciler's behalf; `forget_one` is its one-memory forget
    (`Reconciler.forget_memory`: fixed reason, the versions it superseded too)."""

    def __init__(self, store: Any, llm: LLMClient | None, jobs: Any, forget_one: ForgetOne) -> None:
        self.store = store
        self.llm = llm
        self.jobs = jobs  # the queue (`JobQueue`), or None: no dead jobs to erase
        self.forget_one = forget_one

    async def forget(
        self,
        tenant: str,
        spaces: list[str],
        request: str,
        llm: LLMContext | None,
        job_id: str | None,
    ) -> list[Outcome]:
        """Forget what a request in the user's words means, or nothing.

        Every active memory of the readable spaces holding all the request's words ("my
        alarm code" -> alarm, code; folded and stemmed) is forgotten, without a model,
        however many there are and however they rank: those among the FORGET_MAX
        recalled, then every one the full-text sweep finds (`_forget_holding`). When none holds
        them all, the model may pick the one memory it clearly means among the recalled.
        Dead jobs of these spaces whose text holds all the words lose their text first
        (`_erase_dead_jobs`): retrying one would learn the forgotten fact again."""
        wanted = stems(request, FORGET_FILLER)
        if wanted:
            await self._erase_dead_jobs(tenant, spaces, wanted, job_id)
        results = await self.store.recall(
            RecallQuery(tenant, spaces, request, top_k=FORGET_MAX, background=True)
        )
        if wanted:
            exact = [r.memory for r in results if wanted <= stems(r.memory.content)]
            outcomes = [await self.forget_one(tenant, m, job_id) for m in exact]
            outcomes += await self._forget_holding(tenant, spaces, request, wanted, job_id)
            if outcomes:
                return outcomes
        candidates = {r.memory.id: r.memory for r in results}
        if not candidates or self.llm is None:
            return [Outcome("not_forgotten", reason="no candidate memory")]
        context = llm or LLMContext()
        try:
            answer = await self.llm.complete_json(
                choose_messages(request, [(i, m.content or "") for i, m in candidates.items()]),
                CHOOSE_SCHEMA,
                model=context.model,
                credentials=context.credentials,
            )
        except LLMError:
            return [Outcome("not_forgotten", reason="the model gave no usable answer")]
        chosen = answer.get("memory_id") if isinstance(answer, dict) else None
        if chosen not in candidates:
            return [Outcome("not_forgotten", reason="ambiguous or no match")]
        return [await self.forget_one(tenant, candidates[chosen], job_id)]

    async def _erase_dead_jobs(
        self, tenant: str, spaces: list[str], wanted: set[str], job_id: str | None
    ) -> None:
        """Erase the payload of every dead job of `spaces` whose exchange holds all
        `wanted` stems (the rule memories are matched by); the rows stay for the operator
        and a retry of them is refused (memory_core/jobs.py)."""
        if self.jobs is None:
            return
        erased = await self.jobs.erase_dead(
            tenant, spaces, lambda payload: wanted <= stems(payload_text(payload)), job_id
        )
        if erased:
            log.info("forget erased the text of %d dead jobs: %s", len(erased), erased)

    async def _forget_holding(
        self, tenant: str, spaces: list[str], request: str, wanted: set[str], job_id: str | None
    ) -> list[Outcome]:
        """Forget every active memory of `spaces` holding all `wanted` stems, found through
        the store's full-text side (`text_matches`: every hit, not the best k).

        Cost: the store reads only memories whose indexed text holds every word of the
        request (SQLite walks the postings of the rarest word in the tenant's spaces;
        Postgres the GIN index), FORGET_PAGE at a time, and each page is forgotten
        before the next is read, so memory stays bounded by a page whatever the matches;
        the time grows with the matches, never with the tenant's other memories. The
        index's stemmer decides the candidates, the Porter stems above decide the match:
        SQLite's is the same Porter algorithm; Postgres's English one conflates fewer
        words (news/new), so a memory matching only through such a Porter conflation is
        reached by the recall side alone."""
        words = [w for w in re.findall(r"\w+", fold(request)) if w not in FORGET_FILLER]
        outcomes: list[Outcome] = []
        after: int | None = 0
        while after is not None:
            page, after = await self.store.text_matches(tenant, spaces, words, after, FORGET_PAGE)
            for memory in page:
                if wanted <= stems(memory.content):
                    outcomes.append(await self.forget_one(tenant, memory, job_id))
        return outcomes
