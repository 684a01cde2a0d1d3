"""Which sqlite3 module memrelay opens databases with: the standard one where it loads
extensions and has SQLite 3.44+, pysqlite3-binary otherwise (checked on the real
modules of this machine; the Docker image test checks the stdlib side in Debian trixie)."""

from __future__ import annotations

import sqlite3

import pytest

from memory_core.sqlite import db as sqlite_db


def test_this_machines_stdlib_sqlite3_is_refused_with_its_reason():
    problem = sqlite_db.stdlib_problem(sqlite3)
    version = tuple(int(p) for p in sqlite3.sqlite_version.split("."))
    has_loading = hasattr(sqlite3.connect(":memory:"), "enable_load_extension")
    if version >= (3, 44) and has_loading:
        pytest.skip("this Python's sqlite3 can serve memrelay; nothing to refuse here")
    assert problem is not None
    assert ("3.44" in problem) if version < (3, 44) else ("loadable extensions" in problem)


def test_a_module_that_loads_extensions_with_a_new_sqlite_is_accepted():
    dbapi2 = pytest.importorskip("pysqlite3.dbapi2")
    assert sqlite_db.stdlib_problem(dbapi2) is None


def test_the_chosen_module_can_serve_and_says_why():
    assert sqlite_db.USABLE
    if sqlite_db.stdlib_problem(sqlite3) is None:
        assert (
            sqlite_db.sqlite3 is sqlite3 and sqlite_db.MODULE_NOTE == "the standard sqlite3 module"
        )
    else:
        assert sqlite_db.sqlite3 is not sqlite3 and "pysqlite3-binary" in sqlite_db.MODULE_NOTE
