"""Wires memory_core and extraction into the proxy for `memrelay serve`."""

from __future__ import annotations

from extraction.llm import OpenAICompatibleLLM
from extraction.reconcile import Reconciler
from extraction.worker import ExtractionWorkers
from memory_core.embedder import FastEmbedEmbedder
from memory_core.sqlite_jobs import SQLiteJobs
from memory_core.sqlite_store import SQLiteStore
from proxy.app import Resource, create_app
from proxy.asgi import ASGIApp
from proxy.learning import ExtractionInterceptor
from proxy.memory import RecallInterceptor
from proxy.settings import Settings


class LLMResource:
    """Closes the extraction client with the app."""

    def __init__(self, llm: OpenAICompatibleLLM) -> None:
        self.llm = llm

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        await self.llm.aclose()


def build_app(settings: Settings, store: SQLiteStore | None = None) -> ASGIApp:
    """The app `memrelay serve` runs: proxy, embedded SQLite memory, extraction workers."""
    if store is None:
        store = SQLiteStore(settings.db, FastEmbedEmbedder(settings.embedding_model_dir))
    jobs = SQLiteJobs(store)
    llm = OpenAICompatibleLLM(
        settings.extraction_url or settings.upstream_url or "",
        model=settings.extraction_model,
        api_key=settings.extraction_api_key,
        timeout=settings.extraction_timeout,
        thinking_off=settings.extraction_thinking_off,
        max_wait=settings.extraction_retry_base_seconds * 2,
    )
    workers = ExtractionWorkers(
        jobs,
        llm,
        Reconciler(store, llm),
        concurrency=settings.extraction_workers,
        lease_seconds=settings.extraction_lease_seconds,
        retry_base_seconds=settings.extraction_retry_base_seconds,
    )
    interceptors = [
        RecallInterceptor(store, settings),
        ExtractionInterceptor(jobs, workers, settings),
    ]
    # Closed in reverse: workers finish (or give back) their jobs, then the client, then the store.
    resources: list[Resource] = [store, LLMResource(llm), workers]
    return create_app(settings, interceptors=interceptors, resources=resources)
