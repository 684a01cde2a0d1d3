"""Wires memory_core and extraction into the proxy for `memrelay serve`."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from extraction.entities import GLiNER2Entities
from extraction.llm import OpenAICompatibleLLM
from extraction.reconcile import Reconciler
from extraction.worker import ChatActivity, ExtractionWorkers
from memory_core.backends import is_postgres_url, jobs_for, make_store
from memory_core.embedder import make_embedder
from memory_core.store import MemoryStore
from proxy.admin.api import AdminAPI
from proxy.admin.mcp_http import MCPEndpoint
from proxy.admin.openapi import openapi_document
from proxy.admin.ui.inspector import Inspector
from proxy.admin.ui.session import BrowserSessions
from proxy.admin.ui.tally import RecallTally
from proxy.app import Resource, create_app
from proxy.edge.keys import KeyStore
from proxy.local_llm import LocalLlamaServer
from proxy.memory.learning import ExtractionInterceptor
from proxy.memory.recall import RecallInterceptor
from proxy.metrics import Metrics
from proxy.relay.asgi import ASGIApp
from proxy.settings import Settings


class LLMResource:
    """Closes the extraction client with the app."""

    def __init__(self, llm: OpenAICompatibleLLM) -> None:
        self.llm = llm

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        await self.llm.aclose()


def build_app(settings: Settings, store: MemoryStore | None = None) -> ASGIApp:
    """The app `memrelay serve` runs: proxy, memory (SQLite file or shared Postgres),
    extraction workers, admin API, metrics."""
    local: LocalLlamaServer | None = None
    if not settings.upstream_url:
        local = LocalLlamaServer(
            settings.model,
            ctx=settings.local_ctx,
            parallel=settings.local_parallel,
            threads=settings.local_threads,
        )
        settings = settings.model_copy(update={"upstream_url": local.url})
    if store is None:
        embedder = make_embedder(
            settings.embedder, settings.embedding_model_dir, query_model=settings.query_model
        )
        options = (
            {} if is_postgres_url(settings.db) else {"search_process": settings.search_process}
        )
        store = make_store(settings.db, embedder, **options)
    jobs = jobs_for(store)
    metrics = Metrics()
    llm = OpenAICompatibleLLM(
        settings.extraction_url or settings.upstream_url or "",
        model=settings.extraction_model,
        api_key=settings.extraction_api_key,
        timeout=settings.extraction_timeout,
        thinking_off=settings.extraction_thinking_off,
        max_wait=settings.extraction_retry_base_seconds * 2,
        max_tokens=settings.extraction_max_tokens,
    )
    entities = (
        GLiNER2Entities(settings.gliner_model, settings.gliner_labels, settings.gliner_threshold)
        if settings.gliner_model
        else None
    )
    reconciler = Reconciler(store, llm, jobs=jobs)
    yield_to_chats = settings.extraction_yield_to_chats
    if yield_to_chats is None:
        yield_to_chats = local is not None  # the embedded llama.cpp's slots are shared
    activity = ChatActivity() if yield_to_chats else None
    concurrency = settings.extraction_workers
    if local is not None and activity is not None and concurrency:
        # Keep one of the embedded llama.cpp's slots for users: a chat that arrives while
        # extraction runs starts at once instead of waiting for a slot.
        concurrency = min(concurrency, max(1, settings.local_parallel - 1))
    workers = ExtractionWorkers(
        jobs,
        llm,
        reconciler,
        entities=entities,
        concurrency=concurrency,
        lease_seconds=settings.extraction_lease_seconds,
        retry_base_seconds=settings.extraction_retry_base_seconds,
        done_retention_seconds=settings.extraction_done_retention_seconds,
        # A draft older than the longest possible exchange belongs to a process that died.
        draft_max_age_seconds=settings.total_timeout + 60,
        yield_to=activity,
    )
    metrics.snapshot.jobs = lambda: workers.counts
    batcher = getattr(store, "batcher", None)
    if batcher is not None:
        metrics.snapshot.embedding = batcher.stats
    metrics.snapshot.search = getattr(store, "search_status", None)
    tally = RecallTally()  # recall outcomes per tenant, for the inspector's stats page
    interceptors = [
        RecallInterceptor(store, settings, metrics),
        tally,
        ExtractionInterceptor(jobs, workers, settings, metrics, activity),
    ]
    # What an operator adds through the admin API is recorded as theirs, not extraction's.
    admin = AdminAPI(store, jobs, Reconciler(store, llm, actor="api"), settings)
    mcp = MCPEndpoint(store, Reconciler(store, llm, actor="mcp"), settings)

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document())

    async def metrics_endpoint(request: Request) -> Response:
        metrics.snapshot.queue = await jobs.job_counts()
        metrics.snapshot.health = await workers.health()
        metrics.snapshot.memories = await store.status_counts()
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    keys = KeyStore(settings.keys_file, must_exist=True)
    sessions = BrowserSessions(
        settings.ui_secret, keys, settings.default_tenant, settings.ui_session_hours
    )
    # The injection preview runs a recall interceptor of its own (no metrics counted).
    preview = RecallInterceptor(store, settings)
    inspector = Inspector(store, jobs, sessions, preview, settings, tally)
    routes = [
        Route("/memrelay/openapi.json", openapi, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *admin.routes(),
        mcp.route(),
        *inspector.routes(),
    ]
    # Closed in reverse: MCP calls end, workers finish (or give back) their jobs, then the
    # client, then the store.
    resources: list[Resource] = [store, LLMResource(llm), workers, mcp]
    if local is not None:
        resources.insert(0, local)  # up before the first request, down after the last
    return create_app(
        settings,
        interceptors=interceptors,
        resources=resources,
        routes=routes,
        metrics=metrics,
        keys=keys,
        readiness=learning_readiness(workers),
        browser=sessions,
    )


def learning_readiness(workers: ExtractionWorkers) -> Any:
    """The learning loop's part of /memrelay/readyz: not ready when workers should run
    and none does (the supervisor restarts them, so this means it cannot)."""

    async def check() -> tuple[bool, dict[str, Any]]:
        try:
            health = await workers.health()
        except Exception as exc:
            return False, {"error": f"{type(exc).__name__}: {exc}"}
        return not (health["workers"] and not health["workers_alive"]), health

    return check
