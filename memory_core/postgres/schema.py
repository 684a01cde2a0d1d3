"""The Postgres schema, as forward migrations, bound to the embedder like the SQLite one.

Vectors (pgvector, HNSW, cosine) and text-search vectors (tsvector, GIN) live in
columns of `memories` that only active rows may fill: a CHECK constraint makes the
database itself refuse an inactive memory that could still be found by recall.
Concurrent replicas starting at once migrate under one advisory lock.
"""

from __future__ import annotations

from psycopg import AsyncConnection

from memory_core.errors import SchemaMismatch

MIGRATION_LOCK = 7_310_001  # pg_advisory_lock key held while migrating


def _v1(dim: int) -> list[str]:
    return [
        "CREATE EXTENSION IF NOT EXISTS vector",
        f"""CREATE TABLE memories (
            seq bigserial PRIMARY KEY,
            id text NOT NULL UNIQUE,
            tenant text NOT NULL,
            space text NOT NULL,
            kind text NOT NULL,
            content text,
            subject text,
            attribute text,
            value text,
            confidence double precision NOT NULL,
            source text NOT NULL,
            provenance jsonb NOT NULL DEFAULT '[]',
            status text NOT NULL CHECK (status IN ('active','superseded','forgotten','expired')),
            superseded_by text,
            status_reason text,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            expires_at double precision,
            content_hash text,
            entities jsonb NOT NULL DEFAULT '[]',
            embedding vector({dim}),
            tsv tsvector,
            CONSTRAINT only_active_indexed
                CHECK (status = 'active' OR (embedding IS NULL AND tsv IS NULL))
        )""",
        "CREATE INDEX memories_scope ON memories (tenant, space, status)",
        "CREATE INDEX memories_slot ON memories (tenant, subject, attribute)",
        "CREATE INDEX memories_hash ON memories (content_hash)",
        "CREATE INDEX memories_expiry ON memories (expires_at) WHERE expires_at IS NOT NULL",
        "CREATE INDEX memories_created ON memories (tenant, created_at)",
        "CREATE INDEX memories_embedding ON memories USING hnsw (embedding vector_cosine_ops)"
        " WHERE status = 'active'",
        "CREATE INDEX memories_tsv ON memories USING gin (tsv) WHERE status = 'active'",
        """CREATE TABLE events (
            seq bigserial PRIMARY KEY,
            event_id text NOT NULL UNIQUE,
            memory_id text NOT NULL,
            tenant text NOT NULL,
            space text NOT NULL,
            action text NOT NULL,
            actor text NOT NULL,
            reason text,
            at double precision NOT NULL,
            detail jsonb NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX events_feed ON events (tenant, seq)",
        "CREATE INDEX events_memory ON events (memory_id, seq)",
        """CREATE TABLE jobs (
            seq bigserial PRIMARY KEY,
            id text NOT NULL UNIQUE,
            tenant text NOT NULL,
            space text NOT NULL,
            status text NOT NULL CHECK (status IN ('pending','leased','done','dead')),
            payload jsonb,
            attempts integer NOT NULL DEFAULT 0,
            max_attempts integer NOT NULL,
            available_at double precision NOT NULL,
            lease_owner text,
            lease_until double precision,
            last_error text,
            result jsonb,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL
        )""",
        "CREATE INDEX jobs_claim ON jobs (status, available_at, seq)",
        "CREATE INDEX jobs_scope ON jobs (tenant, space, status, seq)",
    ]


def _v2(dim: int) -> list[str]:
    """Jobs written before the answer (drafts), a content hash for dedup, retention."""
    return [
        "ALTER TABLE jobs ADD COLUMN draft boolean NOT NULL DEFAULT false",
        "ALTER TABLE jobs ADD COLUMN content_hash text",
        "CREATE INDEX jobs_content ON jobs (tenant, space, content_hash)",
        "CREATE INDEX jobs_finished ON jobs (status, updated_at)",
    ]


def _v3(dim: int) -> list[str]:
    """Recall quality (issue 17): when the thing was said, set by callers and extraction."""
    return ["ALTER TABLE memories ADD COLUMN observed_at double precision"]


def _v4(dim: int) -> list[str]:
    """Standing rules' own recall path (issue 17, memory_core/standing_rules.py): a
    tenant's active constraints, preferences and mistakes without scanning its facts."""
    return [
        "CREATE INDEX IF NOT EXISTS memories_standing ON memories (tenant, kind)"
        " WHERE status = 'active'"
    ]


def _v5(dim: int) -> list[str]:
    """Full-text statistics per tenant and read spaces (issue 17, text_stats.py): each
    active memory's length in tokens, kept by a trigger wherever `tsv` is written, and an
    index that sums a scope's lengths and counts its memories without reading the table.
    The length is the last token position, stop words included, as FTS5 counts tokens."""
    return [
        "CREATE FUNCTION memrelay_token_count(tsvector) RETURNS integer"
        " LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE"
        " AS $$SELECT coalesce(max(p), 0)::integer FROM unnest($1) u, unnest(u.positions) p$$",
        "CREATE FUNCTION memrelay_set_tsv_length() RETURNS trigger LANGUAGE plpgsql"
        " AS $$BEGIN NEW.tsv_length := memrelay_token_count(NEW.tsv); RETURN NEW; END$$",
        "ALTER TABLE memories ADD COLUMN tsv_length integer",
        "UPDATE memories SET tsv_length = memrelay_token_count(tsv) WHERE tsv IS NOT NULL",
        "CREATE TRIGGER memories_tsv_length BEFORE INSERT OR UPDATE OF tsv ON memories"
        " FOR EACH ROW EXECUTE FUNCTION memrelay_set_tsv_length()",
        "CREATE INDEX memories_text_stats ON memories (tenant, space) INCLUDE (tsv_length)"
        " WHERE status = 'active'",
    ]


def _v6(dim: int) -> list[str]:
    """Jobs holding a forget request wait for their tenant's earlier jobs in every space
    (memory_core/jobs.py); the index finds those without reading other tenants' jobs."""
    return [
        "ALTER TABLE jobs ADD COLUMN forgets boolean NOT NULL DEFAULT false",
        "CREATE INDEX jobs_tenant_order ON jobs (tenant, status, seq)",
    ]


MIGRATIONS = [_v1, _v2, _v3, _v4, _v5, _v6]


async def migrate(conn: AsyncConnection, embedder_name: str, dim: int) -> int:
    """Bring the database to the newest version; refuse one made for another embedder."""
    await conn.set_autocommit(True)
    await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version integer NOT NULL)")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS meta (key text PRIMARY KEY, value text NOT NULL)"
        )
        row = await (await conn.execute("SELECT version FROM schema_version")).fetchone()
        version = row[0] if row else 0
        if version > len(MIGRATIONS):
            raise SchemaMismatch(
                f"database schema version {version} is newer than this memrelay ({len(MIGRATIONS)})"
            )
        meta = dict(await (await conn.execute("SELECT key, value FROM meta")).fetchall())
        if meta and (meta.get("embedder") != embedder_name or meta.get("dim") != str(dim)):
            raise SchemaMismatch(
                f"database was built with embedder {meta.get('embedder')} ({meta.get('dim')}"
                f" dims), not {embedder_name} ({dim} dims)"
            )
        for number in range(version + 1, len(MIGRATIONS) + 1):
            async with conn.transaction():
                for statement in MIGRATIONS[number - 1](dim):
                    await conn.execute(statement)
                await conn.execute("DELETE FROM schema_version")
                await conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (number,))
                await conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('embedder', %s), ('dim', %s)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (embedder_name, str(dim)),
                )
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
    return len(MIGRATIONS)
