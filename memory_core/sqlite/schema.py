"""The schema, as forward migrations. A database records its version and its embedder."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memory_core.errors import SchemaMismatch
from memory_core.sqlite import text_index
from memory_core.sqlite.db import Connection

Step = str | Callable[[Connection], None]  # a statement, or code run in the migration


def _v1(dim: int) -> list[str]:
    return [
        """CREATE TABLE memories (
            rowid INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            tenant TEXT NOT NULL,
            space TEXT NOT NULL,
            kind TEXT NOT NULL,
            content TEXT,
            subject TEXT,
            attribute TEXT,
            value TEXT,
            confidence REAL NOT NULL,
            source TEXT NOT NULL,
            provenance TEXT NOT NULL DEFAULT '[]',
            status TEXT NOT NULL CHECK (status IN ('active','superseded','forgotten','expired')),
            superseded_by TEXT,
            status_reason TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            expires_at REAL,
            content_hash TEXT,
            entities TEXT NOT NULL DEFAULT '[]'
        )""",
        "CREATE INDEX memories_scope ON memories (tenant, space, status)",
        "CREATE INDEX memories_slot ON memories (tenant, subject, attribute)",
        "CREATE INDEX memories_hash ON memories (content_hash)",
        "CREATE INDEX memories_expiry ON memories (expires_at) WHERE expires_at IS NOT NULL",
        "CREATE INDEX memories_created ON memories (tenant, created_at)",
        """CREATE TABLE events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            event_id TEXT NOT NULL UNIQUE,
            memory_id TEXT NOT NULL,
            tenant TEXT NOT NULL,
            space TEXT NOT NULL,
            action TEXT NOT NULL,
            actor TEXT NOT NULL,
            reason TEXT,
            at REAL NOT NULL,
            detail TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX events_feed ON events (tenant, seq)",
        "CREATE INDEX events_memory ON events (memory_id, seq)",
        # Only active memories have vectors and text rows: recall cannot reach the rest.
        f"""CREATE VIRTUAL TABLE memory_vec USING vec0(
            tenant TEXT PARTITION KEY,
            space TEXT,
            kind TEXT,
            embedding float[{dim}] distance_metric=cosine
        )""",
        """CREATE VIRTUAL TABLE memory_fts USING fts5(
            content, tokenize = 'porter unicode61 remove_diacritics 2'
        )""",
        "CREATE VIRTUAL TABLE memory_fts_vocab USING fts5vocab(memory_fts, 'row')",
        # Deleting a row removes its tokens from the index at once (forget must erase).
        "INSERT INTO memory_fts (memory_fts, rank) VALUES ('secure-delete', 1)",
    ]


def _v2(dim: int) -> list[str]:
    """The durable extraction queue, in the same file as the memories."""
    return [
        """CREATE TABLE jobs (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            tenant TEXT NOT NULL,
            space TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('pending','leased','done','dead')),
            payload TEXT,
            attempts INTEGER NOT NULL DEFAULT 0,
            max_attempts INTEGER NOT NULL,
            available_at REAL NOT NULL,
            lease_owner TEXT,
            lease_until REAL,
            last_error TEXT,
            result TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX jobs_claim ON jobs (status, available_at, seq)",
        "CREATE INDEX jobs_scope ON jobs (tenant, space, status, seq)",
    ]


def _v3(dim: int) -> list[str]:
    """Jobs written before the answer (drafts), a content hash for dedup, retention."""
    return [
        "ALTER TABLE jobs ADD COLUMN draft INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN content_hash TEXT",
        "CREATE INDEX jobs_content ON jobs (tenant, space, content_hash)",
        "CREATE INDEX jobs_finished ON jobs (status, updated_at)",
    ]


def _v4(dim: int) -> list[str]:
    """Recall quality (issue 17): when the thing was said, set by callers and extraction."""
    return ["ALTER TABLE memories ADD COLUMN observed_at REAL"]


def _v5(dim: int) -> list[Step]:
    """Full-text statistics and postings per tenant and space (issue 17), filled from the
    active memories: BM25 counted over one tenant's read spaces, not the whole index."""
    return [*text_index.TABLES, text_index.index_all]


def _v6(dim: int) -> list[str]:
    """Jobs holding a forget request wait for their tenant's earlier jobs in every space
    (memory_core/jobs.py); the index finds those without reading other tenants' jobs."""
    return [
        "ALTER TABLE jobs ADD COLUMN forgets INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX jobs_tenant_order ON jobs (tenant, status, seq)",
    ]


MIGRATIONS: list[Callable[[int], Sequence[Step]]] = [_v1, _v2, _v3, _v4, _v5, _v6]


def migrate(conn: Connection, embedder_name: str, dim: int) -> int:
    """Bring the database to the newest version; refuse one made for another embedder."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    version = row[0] if row else 0
    if version > len(MIGRATIONS):
        raise SchemaMismatch(
            f"database schema version {version} is newer than this memrelay ({len(MIGRATIONS)})"
        )
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if meta and (meta.get("embedder") != embedder_name or meta.get("dim") != str(dim)):
        raise SchemaMismatch(
            f"database was built with embedder {meta.get('embedder')} ({meta.get('dim')} dims), "
            f"not {embedder_name} ({dim} dims)"
        )
    for number in range(version + 1, len(MIGRATIONS) + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for step in MIGRATIONS[number - 1](dim):
                if callable(step):
                    step(conn)
                else:
                    conn.execute(step)
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (number,))
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('embedder', ?), ('dim', ?)",
                (embedder_name, str(dim)),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return len(MIGRATIONS)
