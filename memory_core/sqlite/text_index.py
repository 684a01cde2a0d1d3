"""Full-text postings and statistics per tenant and space, beside the FTS5 index.

Why: FTS5 counts a term's documents, the row count and the average document length
over the whole index, so one tenant's memories changed another tenant's BM25, and the
cost budget could only count a term's postings index-wide (a word common in one tenant
went unscored in every tenant; a word rare index-wide but common in one tenant cost
that tenant a scan of all its matches). Here each (tenant, space) scope has its
document count and total length (`text_scopes`), each term's document count
(`text_terms`) and each term's postings with the term's frequency and the document's
length (`text_postings`, read as one index range per term and scope). Terms come from
FTS5's own tokenizer (a scratch FTS5 table in the connection's temp schema), so they
are exactly the index's terms, and with one tenant in one space BM25 computed from
these tables equals FTS5's `bm25()` (a test pins it).

Only active memories are indexed (as in FTS5): `index_doc` and `unindex_doc` run in
the same transaction as the memory's status change, and `text_docs` remembers each
indexed document's scope, length and terms so that removal needs no re-tokenizing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from memory_core.sqlite.db import Connection, OperationalError

TOKENIZE = "porter unicode61 remove_diacritics 2"  # as memory_fts (schema v1)
_SCRATCH = "memrelay_tokens"
_AHEAD = threading.local()  # texts of a bulk add, tokenized together by the writer

TABLES = [
    """CREATE TABLE text_scopes (
        id INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        space TEXT NOT NULL,
        docs INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        UNIQUE (tenant, space)
    )""",
    """CREATE TABLE text_terms (
        scope INTEGER NOT NULL,
        term TEXT NOT NULL,
        docs INTEGER NOT NULL,
        PRIMARY KEY (scope, term)
    ) WITHOUT ROWID""",
    """CREATE TABLE text_postings (
        scope INTEGER NOT NULL,
        term TEXT NOT NULL,
        doc INTEGER NOT NULL,
        tf INTEGER NOT NULL,
        dl INTEGER NOT NULL,
        PRIMARY KEY (scope, term, doc)
    ) WITHOUT ROWID""",
    """CREATE TABLE text_docs (
        doc INTEGER PRIMARY KEY,
        scope INTEGER NOT NULL,
        dl INTEGER NOT NULL,
        terms TEXT NOT NULL -- {term: frequency}, JSON
    )""",
]


def _create_scratch(conn: Connection) -> None:
    conn.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{_SCRATCH} USING fts5("
        f"content, content='', tokenize = '{TOKENIZE}')"
    )
    conn.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{_SCRATCH}_vocab"
        f" USING fts5vocab(temp, {_SCRATCH}, 'instance')"
    )


def tokenize(conn: Connection, texts: Sequence[str]) -> list[dict[str, int]]:
    """Each text's terms with their frequencies, by FTS5's tokenizer (the index's own)."""
    if not texts:
        return []
    rows = [(i, text or "") for i, text in enumerate(texts, start=1)]
    insert = f"INSERT INTO temp.{_SCRATCH} (rowid, content) VALUES (?, ?)"
    try:
        conn.executemany(insert, rows)
    except OperationalError:  # first use on this connection
        _create_scratch(conn)
        conn.executemany(insert, rows)
    try:
        found = conn.execute(
            f"SELECT doc, term, count(*) FROM temp.{_SCRATCH}_vocab GROUP BY doc, term"
        ).fetchall()
    finally:
        conn.execute(f"INSERT INTO temp.{_SCRATCH} ({_SCRATCH}) VALUES ('delete-all')")
    out: list[dict[str, int]] = [{} for _ in texts]
    for doc, term, count in found:
        out[doc - 1][term] = count
    return out


def index_doc(conn: Connection, doc: int, tenant: str, space: str, content: str | None) -> None:
    """Add an active memory's text to its scope's postings and statistics."""
    ahead = getattr(_AHEAD, "terms", None)
    terms = ahead.get(content or "") if ahead else None
    if terms is None:
        terms = tokenize(conn, [content or ""])[0]
    _add(conn, doc, tenant, space, terms)


@contextmanager
def tokenized_ahead(conn: Connection, texts: Sequence[str]) -> Iterator[None]:
    """Tokenize a bulk add's texts in one pass (about 40% cheaper than one by one);
    `index_doc` on this thread takes them from here meanwhile."""
    _AHEAD.terms = dict(zip(texts, tokenize(conn, texts), strict=True))
    try:
        yield
    finally:
        _AHEAD.terms = None


def _add(conn: Connection, doc: int, tenant: str, space: str, terms: dict[str, int]) -> None:
    length = sum(terms.values())
    (scope,) = conn.execute(
        "INSERT INTO text_scopes (tenant, space, docs, tokens) VALUES (?, ?, 1, ?)"
        " ON CONFLICT (tenant, space) DO UPDATE SET docs = docs + 1,"
        " tokens = tokens + excluded.tokens RETURNING id",
        (tenant, space, length),
    ).fetchone()
    # One statement per table, the terms as a JSON object: the per-statement cost, not
    # the B-tree work, dominated with one statement per term.
    joined = json.dumps(terms)
    conn.execute(
        "INSERT INTO text_docs (doc, scope, dl, terms) VALUES (?, ?, ?, ?)",
        (doc, scope, length, joined),
    )
    conn.execute(
        "INSERT INTO text_postings (scope, term, doc, tf, dl)"
        " SELECT ?, key, ?, value, ? FROM json_each(?)",
        (scope, doc, length, joined),
    )
    conn.execute(
        "INSERT INTO text_terms (scope, term, docs) SELECT ?, key, 1 FROM json_each(?)"
        " WHERE true ON CONFLICT (scope, term) DO UPDATE SET docs = docs + 1",
        (scope, joined),
    )


def unindex_doc(conn: Connection, doc: int) -> None:
    """Remove a memory's text from its scope (nothing when it was not indexed). A term
    no memory of the scope holds any more leaves no row (forget must erase)."""
    row = conn.execute(
        "DELETE FROM text_docs WHERE doc = ? RETURNING scope, dl, terms", (doc,)
    ).fetchone()
    if row is None:
        return
    scope, length, joined = row
    conn.execute(
        "UPDATE text_scopes SET docs = docs - 1, tokens = tokens - ? WHERE id = ?",
        (length, scope),
    )
    conn.execute(
        "DELETE FROM text_postings WHERE scope = ? AND doc = ?"
        " AND term IN (SELECT key FROM json_each(?))",
        (scope, doc, joined),
    )
    conn.execute(
        "UPDATE text_terms SET docs = docs - 1 WHERE scope = ?"
        " AND term IN (SELECT key FROM json_each(?))",
        (scope, joined),
    )
    conn.execute(
        "DELETE FROM text_terms WHERE scope = ? AND docs <= 0"
        " AND term IN (SELECT key FROM json_each(?))",
        (scope, joined),
    )


def index_all(conn: Connection) -> None:
    """Index every active memory (the migration of a database made before these tables)."""
    rows = conn.execute(
        "SELECT rowid, tenant, space, content FROM memories WHERE status = 'active' ORDER BY rowid"
    ).fetchall()
    for start in range(0, len(rows), 512):
        batch = rows[start : start + 512]
        for (doc, tenant, space, _), terms in zip(
            batch, tokenize(conn, [r[3] or "" for r in batch]), strict=True
        ):
            _add(conn, doc, tenant, space, terms)
