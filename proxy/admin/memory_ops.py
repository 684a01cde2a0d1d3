"""The memory operations the admin API, the MCP server and the inspector share.

Each takes the `MemoryScope` the edge decided (or, for `memrelay mcp` over stdio, the one
its command line fixed) and never a tenant or space chosen by the caller: the surfaces
differ only in how they read their input and shape their errors, so a memory, its
history or a job of another tenant is out of reach the same way whichever one asks.
"""

from __future__ import annotations

from typing import Any

from extraction.facts import Fact
from extraction.long_content import apply_long
from extraction.reconcile import Reconciler
from memory_core.errors import NotFound
from memory_core.jobs import JobQueue
from memory_core.model import Event, Memory
from memory_core.recall import Recalled, RecallQuery
from memory_core.standing_rules import StandingPolicy
from memory_core.store import MemoryStore
from proxy.admin.models import ForgetBody, RecallBody, RememberBody
from proxy.memory.scoping import MemoryScope


def fact_from(body: RememberBody, stated_by: str) -> Fact:
    """A remember request as the fact reconciliation takes (who stated it decides what it
    may replace: see extraction/reconcile.py)."""
    return Fact(
        content=body.content,
        kind=body.kind,
        subject=body.subject,
        attribute=body.attribute,
        value=body.value,
        confidence=body.confidence,
        stated_by=stated_by,
        expires_at=body.expires_at,
        observed_at=body.observed_at,
    )


async def remember(
    store: MemoryStore,
    reconciler: Reconciler,
    scope: MemoryScope,
    fact: Fact,
    provenance: dict[str, Any],
) -> dict[str, Any]:
    """Reconcile `fact` into the scope's write space, like an extracted fact (it may
    reinforce or supersede); the admin API's answer body. Content too long for one memory
    is stored as several parts of one source (`parts` in the answer)."""
    outcomes = await apply_long(reconciler, scope.tenant, scope.write_space, fact, provenance)
    memories = [
        await store.get(scope.tenant, o.memory_id) if o.memory_id else None for o in outcomes
    ]
    outcome, memory = outcomes[0], memories[0]
    answer: dict[str, Any] = {
        "action": outcome.action,
        "superseded": outcome.old_ids if outcome.action == "superseded" else [],
        "reason": outcome.reason,
        "memory": memory.as_dict() if memory else None,
    }
    if len(outcomes) > 1:
        answer["parts"] = [
            {"action": o.action, "memory": m.as_dict() if m else None}
            for o, m in zip(outcomes, memories, strict=True)
        ]
    return answer


async def recall(
    store: MemoryStore,
    scope: MemoryScope,
    body: RecallBody,
    standing: StandingPolicy | None = None,
) -> list[Recalled]:
    """Recall over every space the scope reads, each result with its score breakdown;
    with `standing`, standing rules join as in the proxy's recall."""
    return await store.recall(
        RecallQuery(
            scope.tenant,
            list(scope.read_spaces),
            body.query,
            top_k=body.top_k,
            kinds=list(body.kinds) if body.kinds else None,
            min_similarity=body.min_similarity,
            standing=standing,
        )
    )


async def forget_matches(
    store: MemoryStore,
    tenant: str,
    spaces: list[str],
    query: str,
    top_k: int,
    min_similarity: float,
) -> list[Memory]:
    """What a forget-by-query takes: the nearest active memories by meaning alone (a
    shared word is not enough to erase something)."""
    results = await store.recall(
        RecallQuery(
            tenant,
            spaces,
            query,
            top_k=top_k,
            min_similarity=min_similarity,
            use_text=False,
            exact_vector=True,
        )
    )
    return [r.memory for r in results]


async def forget_matching(
    store: MemoryStore, scope: MemoryScope, body: ForgetBody, reason: str, actor: str
) -> dict[str, Any]:
    """Forget (or, on a dry run, only name) the memories of the read spaces close to
    `body.query`."""
    matches = await forget_matches(
        store,
        scope.tenant,
        list(scope.read_spaces),
        body.query,
        body.top_k,
        body.min_similarity,
    )
    if not body.dry_run:
        for memory in matches:
            await store.forget(scope.tenant, memory.id, reason, actor=actor)
    return {
        "dry_run": body.dry_run,
        "forgotten" if not body.dry_run else "would_forget": [
            {"id": m.id, "content": m.content, "space": m.space} for m in matches
        ],
    }


def forget_reason(surface: str, request_id: str, by_query: bool = False) -> str:
    """Fixed words and ids only: a reason never carries what the user wanted gone."""
    how = "forgotten by query" if by_query else "forgotten"
    return f"{how} through the {surface} (request {request_id})"


async def tenant_stats(store: MemoryStore, jobs: JobQueue, tenant: str) -> dict[str, Any]:
    """Counts by space, status and kind, and the tenant's learning jobs by status."""
    stats = await store.stats(tenant)
    stats["jobs"] = await jobs.job_counts(tenant)
    return stats


async def require_memory(
    store: MemoryStore, tenant: str, memory_id: str, spaces: tuple[str, ...] | None = None
) -> Memory:
    """The tenant's memory `memory_id` (in one of `spaces`, when given), or NotFound.

    The message is the same whether the id exists in another tenant, in a space the
    caller does not read, or nowhere: it tells nothing about other tenants."""
    memory = await store.get(tenant, memory_id)
    if memory is None or (spaces is not None and memory.space not in spaces):
        where = f"tenant {tenant!r}" if spaces is None else "the spaces this caller reads"
        raise NotFound(f"no memory {memory_id!r} in {where}")
    return memory


async def history(
    store: MemoryStore, tenant: str, memory_id: str, spaces: tuple[str, ...] | None = None
) -> list[Event]:
    """How one memory came to be what it is; NotFound unless the caller may see it."""
    await require_memory(store, tenant, memory_id, spaces)
    return await store.history(tenant, memory_id)
