"""Opening the SQLite database: pysqlite3 (for extension loading), sqlite-vec, pragmas.

This Python's standard `sqlite3` cannot load extensions, so memrelay uses
`pysqlite3-binary`, a drop-in module with its own modern SQLite that can.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlite_vec

try:
    from pysqlite3 import dbapi2 as sqlite3
except ImportError:  # pragma: no cover - platforms without the wheel
    import sqlite3  # type: ignore[no-redef]

Connection = Any  # pysqlite3's Connection has no shared type with the stdlib one
OperationalError = sqlite3.OperationalError
IntegrityError = sqlite3.IntegrityError


def connect(path: Path, *, readonly: bool = False) -> Connection:
    """A connection with sqlite-vec loaded, WAL on and secure_delete on."""
    if readonly:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, check_same_thread=False, isolation_level=None
        )
    else:
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    if not hasattr(conn, "enable_load_extension"):
        raise RuntimeError("this Python's sqlite3 cannot load extensions; install pysqlite3-binary")
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    conn.enable_load_extension(False)
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute("PRAGMA secure_delete = ON")
    conn.execute("PRAGMA cache_size = -65536")
    conn.execute("PRAGMA mmap_size = 1073741824")
    conn.execute("PRAGMA temp_store = MEMORY")
    if not readonly:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
    return conn
