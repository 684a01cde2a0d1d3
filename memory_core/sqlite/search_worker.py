"""The search process's side: `python -m memory_core.sqlite.search_worker DB MODEL DIM FD...`.

Each inherited socket is served by a thread of its own with its own SQLite connection
(it only reads: searches, and the events that keep its copy current); the threads share
one vector copy (memory_core/sqlite/vector_cache.py), which brings itself up to date
from the database's events before every scan, as the parent's does. A request is a
pickled ("search", SearchRequest), ("sync", tenant) or ("ping", None) (the parent's
heartbeat, on a socket of its own); the answer ("ok", value) or ("error", text). The
process ends when its sockets close (the parent closed them, or died), so it never
outlives the server that started it; SIGINT and SIGTERM sent to the whole process group
are left to the server, which then closes them.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from memory_core.blas import single_threaded_blas
from memory_core.json_logs import JSONLines
from memory_core.sqlite.db import connect
from memory_core.sqlite.hybrid_search import hybrid_search
from memory_core.sqlite.search_frames import read_frame, write_frame
from memory_core.sqlite.tenant_bm25 import TermHits
from memory_core.sqlite.vector_cache import VectorCache
from memory_core.sqlite.vector_snapshot import SnapshotDir

log = logging.getLogger("memrelay.search")


class _ChildLines(JSONLines):
    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        return {"pid": os.getpid()}  # which process: the server logs the same way


class Worker:
    """What the serving threads share."""

    def __init__(self, db: Path, model: str, dim: int) -> None:
        self.db = db
        snapshots = SnapshotDir(db.with_name(db.name + ".vectors"), model, dim)
        self.cache = VectorCache(dim, snapshots=snapshots)
        self.term_hits = TermHits()

    def serve(self, sock: socket.socket) -> None:
        conn = connect(self.db)
        try:
            write_frame(sock, pickle.dumps(("ready", None)))
            while (frame := read_frame(sock)) is not None:
                write_frame(sock, pickle.dumps(self.answer(conn, frame)))
        except OSError:
            pass  # the parent went away: nobody to answer
        finally:
            conn.close()
            sock.close()

    def answer(self, conn: Any, frame: bytes) -> tuple[str, Any]:
        try:
            kind, value = pickle.loads(frame)
            if kind == "search":
                return "ok", hybrid_search(conn, self.cache, self.term_hits, value)
            if kind == "ping":  # the parent's heartbeat
                return "ok", None
            if kind == "sync":  # drop what the parent forgot now, not at the next scan
                self.cache.refresh(conn, value)
                return "ok", None
            return "error", f"unknown request {kind!r}"
        except Exception as exc:  # one bad request must not end the thread
            log.exception("search failed")
            return "error", f"{type(exc).__name__}: {exc}"


def main(argv: list[str]) -> int:
    db, model, dim, *fds = argv
    # Ctrl-C reaches the terminal's whole process group, and a service manager may send
    # SIGTERM to the whole group too: the server stops and closes this process's sockets,
    # which ends it (it never outlives the server either way).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    handler = logging.StreamHandler()
    handler.setFormatter(_ChildLines())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    single_threaded_blas()
    worker = Worker(Path(db), model, int(dim))
    socks = [socket.socket(fileno=int(fd)) for fd in fds]
    threads = [
        threading.Thread(target=worker.serve, args=(sock,), name=f"search-{i}", daemon=True)
        for i, sock in enumerate(socks)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
