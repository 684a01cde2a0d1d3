"""Telling a full disk apart from other database failures, for a 507 instead of a 500."""

from __future__ import annotations

import errno

_FULL_WORDS = ("database or disk is full", "no space left on device", "disk full")


def storage_full(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) says the database's disk or file is full:
    SQLite's SQLITE_FULL, Postgres' disk_full (53100), or ENOSPC."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        if getattr(current, "sqlstate", None) == "53100" or type(current).__name__ == "DiskFull":
            return True
        if getattr(current, "sqlite_errorcode", None) == 13:  # SQLITE_FULL
            return True
        if any(word in str(current).lower() for word in _FULL_WORDS):
            return True
        current = current.__cause__ or current.__context__
    return False
