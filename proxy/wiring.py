"""Wires memory_core (and later extraction) into the proxy for `memrelay serve`."""

from __future__ import annotations

from memory_core.embedder import FastEmbedEmbedder
from memory_core.sqlite_store import SQLiteStore
from proxy.app import create_app
from proxy.asgi import ASGIApp
from proxy.memory import RecallInterceptor
from proxy.settings import Settings


def build_app(settings: Settings) -> ASGIApp:
    """The app `memrelay serve` runs: the proxy with the embedded SQLite memory."""
    embedder = FastEmbedEmbedder(settings.embedding_model_dir)
    store = SQLiteStore(settings.db, embedder)
    return create_app(
        settings, interceptors=[RecallInterceptor(store, settings)], resources=[store]
    )
