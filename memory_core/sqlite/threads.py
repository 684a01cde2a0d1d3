"""Where blocking SQLite and model calls run, so they never block the event loop.

Writes are serialised through one thread owning one connection; reads use a small pool
of threads, each with its own connection (WAL lets them read while the writer writes);
embedding runs on its own thread so a long batch never holds the writer.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from memory_core.sqlite.db import Connection, connect

T = TypeVar("T")


class ConnectionThreads:
    """A thread pool whose threads each hold one connection to the same database."""

    def __init__(self, path: Path, workers: int, name: str) -> None:
        self.path = path
        self._local = threading.local()
        self._connections: list[Connection] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def _connection(self) -> Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path)
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    async def run(self, fn: Callable[[Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(self._connection()))

    def submit(self, fn: Callable[[Connection], T]) -> Future[T]:
        """Start `fn(conn)` on a pool thread; a job submitted later may wait for it
        (the queue is first in, first out: it is running or done by then)."""
        return self._pool.submit(lambda: fn(self._connection()))

    def run_sync(self, fn: Callable[[Connection], T]) -> T:
        return self._pool.submit(lambda: fn(self._connection())).result()

    def close(self) -> None:
        def close_all() -> None:
            with self._lock:
                for conn in self._connections:
                    conn.close()
                self._connections.clear()

        self._pool.shutdown(wait=True)
        close_all()


def transaction(conn: Connection, fn: Callable[[Connection], T]) -> T:
    """Run `fn` inside BEGIN IMMEDIATE ... COMMIT, rolling back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result
