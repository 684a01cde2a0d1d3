"""Choosing the backend from one setting: a file path means SQLite, a URL means Postgres."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memory_core.embedder import Embedder
from memory_core.jobs import JobQueue
from memory_core.store import MemoryStore


def is_postgres_url(db: object) -> bool:
    return str(db).startswith(("postgresql://", "postgres://"))


def make_store(db: str | Path, embedder: Embedder, **options: Any) -> MemoryStore:
    """An unopened store for `db` (`await store.start()` opens and migrates it)."""
    if is_postgres_url(db):
        from memory_core.postgres.store import PostgresStore  # psycopg loads only when used

        return PostgresStore(str(db), embedder, **options)
    from memory_core.sqlite.store import SQLiteStore

    return SQLiteStore(Path(db), embedder, **options)


def jobs_for(store: MemoryStore) -> JobQueue:
    """The extraction queue that lives beside `store`'s memories."""
    from memory_core.sqlite.store import SQLiteStore

    if isinstance(store, SQLiteStore):
        from memory_core.sqlite.jobs import SQLiteJobs

        return SQLiteJobs(store)
    from memory_core.postgres.jobs import PostgresJobs
    from memory_core.postgres.store import PostgresStore

    if isinstance(store, PostgresStore):
        return PostgresJobs(store)
    raise TypeError(f"no job queue for {type(store).__name__}")


def describe(db: str | Path) -> str:
    """Where the memories live, without a password."""
    if not is_postgres_url(db):
        return f"sqlite:{db}"
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(str(db))
    return f"postgresql:{info.get('dbname', '')}@{info.get('host', 'localhost')}"


def connection_errors() -> tuple[type[BaseException], ...]:
    """What opening an unreachable database raises, for readable messages."""
    import psycopg

    return (OSError, psycopg.OperationalError)
