"""What the admin API and the browser inspector both do, written once.

Both surfaces take the tenant from the identity the edge decided and hand it to these
helpers, so a memory, its history, a forget-by-query or a job of another tenant is out of
reach the same way whichever surface asks.
"""

from __future__ import annotations

from typing import Any

from memory_core.errors import NotFound
from memory_core.jobs import JobQueue
from memory_core.model import Event, Memory
from memory_core.recall import RecallQuery
from memory_core.store import MemoryStore


async def memory_of(store: MemoryStore, tenant: str, memory_id: str) -> Memory:
    """The tenant's memory with this id; NotFound otherwise (another tenant's included)."""
    memory = await store.get(tenant, memory_id)
    if memory is None:
        raise NotFound(f"no memory {memory_id!r} in tenant {tenant!r}")
    return memory


async def history_of(store: MemoryStore, tenant: str, memory_id: str) -> list[Event]:
    await memory_of(store, tenant, memory_id)
    return await store.history(tenant, memory_id)


async def forget_matches(
    store: MemoryStore,
    tenant: str,
    spaces: list[str],
    query: str,
    top_k: int,
    min_similarity: float,
) -> list[Memory]:
    """What a forget-by-query takes: the nearest active memories by meaning alone."""
    results = await store.recall(
        RecallQuery(
            tenant, spaces, query, top_k=top_k, min_similarity=min_similarity, use_text=False
        )
    )
    return [r.memory for r in results]


def forget_reason(surface: str, request_id: str, by_query: bool = False) -> str:
    """Fixed words and ids only: a reason never carries what the user wanted gone."""
    how = "forgotten by query" if by_query else "forgotten"
    return f"{how} through the {surface} (request {request_id})"


async def tenant_stats(store: MemoryStore, jobs: JobQueue, tenant: str) -> dict[str, Any]:
    stats = await store.stats(tenant)
    stats["jobs"] = await jobs.job_counts(tenant)
    return stats
