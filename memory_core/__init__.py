"""memrelay's memory: the store, its lifecycle and events, and hybrid recall. No HTTP here."""

from memory_core.embedder import Embedder, FastEmbedEmbedder
from memory_core.errors import (
    InvalidInput,
    InvalidTransition,
    ModelNotInstalled,
    NotFound,
    SchemaMismatch,
)
from memory_core.model import Event, Memory, NewMemory, severity_of
from memory_core.recall import Recalled, RecallQuery
from memory_core.sqlite.store import SQLiteStore
from memory_core.store import ImportResult, ListQuery, MemoryStore, Page

__all__ = [
    "Embedder",
    "Event",
    "FastEmbedEmbedder",
    "ImportResult",
    "InvalidInput",
    "InvalidTransition",
    "ListQuery",
    "Memory",
    "MemoryStore",
    "ModelNotInstalled",
    "NewMemory",
    "NotFound",
    "Page",
    "RecallQuery",
    "Recalled",
    "SQLiteStore",
    "SchemaMismatch",
    "severity_of",
]
