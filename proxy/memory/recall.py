"""The memory interceptor: scope from headers, recall under a time budget, injection.

Recall never stands in the way of an answer for long: a recall waits its turn at the
gate (proxy/memory/admission.py, at most `recall_queue_ms`), then has its budget
(`recall_budget_ms`); past either, or when the store fails, the request goes upstream
without memories, and the response says so. When the query
embedding is predicted to arrive too late (the embedding queue is longer than the
budget allows), the recall is full-text only and the response says `text_only`: memory
stays on, with the vector side skipped and counted, never silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from memory_core.injection import render
from memory_core.recall import RecallQuery, clean_query
from memory_core.standing_rules import StandingPolicy
from memory_core.store import MemoryStore
from proxy.memory.admission import AdmissionTimeout, RecallGate
from proxy.memory.conversation import recall_query
from proxy.memory.scoping import MemoryScope, scope_for
from proxy.metrics import Metrics
from proxy.relay.exchange import Exchange
from proxy.relay.hooks import ChatContext
from proxy.settings import Settings

log = logging.getLogger("memrelay.memory")
MAX_ID_HEADER = 20


class RecallInterceptor:
    """Recalls and injects before a chat completion goes upstream."""

    def __init__(
        self, store: MemoryStore, settings: Settings, metrics: Metrics | None = None
    ) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.gate = RecallGate(settings.recall_concurrency, settings.recall_queue_ms / 1000)
        self.standing: StandingPolicy | None = settings.standing_policy()

    async def before(self, ctx: ChatContext) -> None:
        scope = scope_for(ctx, self.settings)
        if not scope.reads:
            self._headers(ctx, "off", [], 0.0)
            return
        started = time.perf_counter()
        status, memories = await self._recall(ctx, scope)
        elapsed = (time.perf_counter() - started) * 1000
        ids: list[str] = []
        if memories:
            injection = render(
                memories, self.settings.injection_max_chars, self.settings.memory_max_chars
            )
            if injection.text:
                ctx.inject(injection.text)
                ids = injection.memory_ids
            if status != "text_only":
                status = "ok" if ids else "empty"
        if self.metrics is not None:
            self.metrics.recall.observe(elapsed / 1000)
            self.metrics.recall_status.labels(status).inc()
            self.metrics.injected.inc(len(ids))
        ctx.state["recalled_ids"] = ids
        self._headers(ctx, status, ids, elapsed)

    async def _recall(self, ctx: ChatContext, scope: MemoryScope) -> tuple[str, list[Any]]:
        text = recall_query(ctx.messages, self.settings.recall_query_chars)
        if not text.strip():
            return "empty", []
        query = RecallQuery(
            tenant=scope.tenant,
            spaces=list(scope.read_spaces),
            text=text,
            top_k=self.settings.recall_top_k,
            min_similarity=self.settings.recall_min_similarity,
            standing=self.standing,
        )
        budget = self.settings.recall_budget_ms / 1000
        text_only = False

        async def work() -> list[Any]:
            # The budget starts once admitted: it bounds the recall's work, the gate's
            # own bound (recall_queue_ms) the wait before it.
            nonlocal text_only
            if self._vector_too_late(query, budget):
                query.use_vector = False
                text_only = True
            return await asyncio.wait_for(self.store.recall(query), budget)

        try:
            results, waited = await self.gate.run(scope.tenant, work)
        except AdmissionTimeout as exc:
            log.warning(
                "recall not admitted within %d ms (%d waiting); answering without memories"
                " (request %s)",
                self.settings.recall_queue_ms,
                self.gate.waiting,
                ctx.request_id,
            )
            ctx.state["recall_wait_ms"] = exc.waited * 1000
            return "timeout", []
        except TimeoutError:
            log.warning(
                "recall passed its %d ms budget; answering without memories (request %s)",
                self.settings.recall_budget_ms,
                ctx.request_id,
            )
            return "timeout", []
        except Exception:
            log.exception("recall failed; answering without memories (request %s)", ctx.request_id)
            return "error", []
        ctx.state["recall_wait_ms"] = waited * 1000
        if self.metrics is not None:
            self.metrics.recall_wait.observe(waited)
        if text_only:
            return "text_only", [r.memory for r in results]
        return ("ok" if results else "empty"), [r.memory for r in results]

    def _vector_too_late(self, query: RecallQuery, remaining_s: float) -> bool:
        """True when the query vector is predicted to take more than its share of the
        budget left (the search and injection need the rest); a cached vector is free."""
        batcher = getattr(self.store, "batcher", None)
        if batcher is None or self.settings.recall_vector_share >= 1.0:
            return False
        wait = batcher.expected_wait(query.tenant, clean_query(query.text))
        return wait > remaining_s * self.settings.recall_vector_share

    def _headers(self, ctx: ChatContext, status: str, ids: list[str], elapsed: float) -> None:
        ctx.add_response_header("X-Memrelay-Recall-Status", status)
        ctx.add_response_header("X-Memrelay-Recalled", str(len(ids)))
        ctx.add_response_header("X-Memrelay-Memory-Ids", ",".join(ids[:MAX_ID_HEADER]))
        ctx.add_response_header("X-Memrelay-Recall-Ms", f"{elapsed:.2f}")
        if (waited := ctx.state.get("recall_wait_ms")) is not None:
            ctx.add_response_header("X-Memrelay-Recall-Wait-Ms", f"{waited:.2f}")

    def response_started(self, ctx: ChatContext, status: int) -> None:
        return None

    def wants_answer(self, ctx: ChatContext) -> bool:
        return False

    async def after(self, ctx: ChatContext, exchange: Exchange) -> None:
        return None
