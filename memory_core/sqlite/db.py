"""Opening the SQLite database: a sqlite3 module that loads extensions, sqlite-vec, pragmas.

memrelay needs extension loading (sqlite-vec is one) and SQLite 3.44 or newer (FTS5's
`secure-delete`). The standard `sqlite3` module is used when it has both, as in the
official Python images on Debian trixie (on any architecture). Where it has not (a
Python built without loadable extensions, or an older SQLite), `pysqlite3-binary`, a
drop-in module with its own modern SQLite, is used when installed (it ships wheels for
x86_64 Linux only).
"""

from __future__ import annotations

import sqlite3 as _stdlib_sqlite3
from pathlib import Path
from types import ModuleType
from typing import Any

import sqlite_vec

from memory_core.errors import DatabaseUnavailable

MIN_SQLITE = (3, 44, 0)


def stdlib_problem(module: ModuleType = _stdlib_sqlite3) -> str | None:
    """Why this sqlite3 module cannot serve memrelay, or None when it can."""
    version = tuple(int(p) for p in module.sqlite_version.split("."))
    if version < MIN_SQLITE:
        return f"its SQLite is {module.sqlite_version}, older than 3.44 (FTS5 secure-delete)"
    conn = module.connect(":memory:")
    try:
        if not hasattr(conn, "enable_load_extension"):
            return "it was built without loadable extensions"
        try:
            conn.enable_load_extension(True)
            sqlite_vec.load(conn)
        except Exception as exc:  # any failure means: use the fallback
            return f"it cannot load sqlite-vec ({exc})"
    finally:
        conn.close()
    return None


def choose_module() -> tuple[ModuleType, str, bool]:
    """The sqlite3 module to use, a one-line note of why, and whether it can serve."""
    problem = stdlib_problem()
    if problem is None:
        return _stdlib_sqlite3, "the standard sqlite3 module", True
    try:
        from pysqlite3 import dbapi2
    except ImportError:
        return (
            _stdlib_sqlite3,
            f"the standard sqlite3 module cannot serve memrelay: {problem}; "
            "install pysqlite3-binary (x86_64 Linux) or use a Python whose sqlite3 "
            "loads extensions with SQLite 3.44+",
            False,
        )
    return dbapi2, f"pysqlite3-binary (the standard sqlite3 module: {problem})", True


sqlite3, MODULE_NOTE, USABLE = choose_module()

Connection = Any  # pysqlite3's Connection has no shared type with the stdlib one
OperationalError = sqlite3.OperationalError
IntegrityError = sqlite3.IntegrityError


def check_database_path(path: Path) -> None:
    """Refuse a path whose folder is missing (never create folders silently) or a folder."""
    folder = path.parent
    if not folder.is_dir():
        raise DatabaseUnavailable(
            f"cannot open the SQLite database {path}: the folder {folder} does not exist"
            " (create it first, or fix --db / MEMRELAY_DB)"
        )
    if path.is_dir():
        raise DatabaseUnavailable(f"cannot open the SQLite database {path}: it is a folder")


def connect(path: Path, *, readonly: bool = False) -> Connection:
    """A connection with sqlite-vec loaded, WAL on and secure_delete on."""
    if not USABLE:
        raise RuntimeError(MODULE_NOTE)
    try:
        if readonly:
            conn = sqlite3.connect(
                f"file:{path}?mode=ro", uri=True, check_same_thread=False, isolation_level=None
            )
        else:
            conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA schema_version").fetchone()  # opens the file for real
        if not readonly:
            conn.execute("PRAGMA journal_mode = WAL")
    except sqlite3.DatabaseError as exc:
        raise DatabaseUnavailable(f"cannot open the SQLite database {path}: {exc}") from exc
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    conn.enable_load_extension(False)
    conn.execute("PRAGMA secure_delete = ON")
    conn.execute("PRAGMA cache_size = -65536")
    conn.execute("PRAGMA mmap_size = 1073741824")
    conn.execute("PRAGMA temp_store = MEMORY")
    if not readonly:
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
    return conn
