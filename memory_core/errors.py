"""Errors a store raises; each says what was wrong in words a caller can show."""

from __future__ import annotations


class MemoryError_(Exception):
    """Base class of memory_core errors."""


class InvalidInput(MemoryError_, ValueError):
    """An argument is malformed: a bad tenant or space id, empty content, a bad kind."""


class NotFound(MemoryError_, LookupError):
    """No memory with that id in that tenant."""


class InvalidTransition(MemoryError_):
    """A lifecycle change the state machine does not allow (e.g. forgotten -> active)."""


class ModelNotInstalled(MemoryError_, RuntimeError):
    """The local embedding model is missing; the message names what to install."""


class SchemaMismatch(MemoryError_, RuntimeError):
    """The database was made by another embedder or a newer memrelay."""


class DatabaseUnavailable(MemoryError_, OSError):
    """The database cannot be opened (missing folder, no permission, not a file); the
    message names the path."""
