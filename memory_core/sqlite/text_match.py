"""Every active memory of a tenant's spaces whose text holds all the given words: a
full-text filter, not a ranking (forget requests in words, extraction/forget_words.py).

Why beside recall: recall returns the best k, and a forget must reach every match
however it ranks. The words go through FTS5's own tokenizer, so they are the index's
terms; the postings of the rarest term in the tenant's scopes are walked in document
order, a page at a time, each checked for the other terms by primary key. A sweep
therefore costs in proportion to how many memories of those spaces hold the rarest
term, never the size of the index or of other tenants.
"""

from __future__ import annotations

from collections.abc import Sequence

from memory_core.sqlite.db import Connection
from memory_core.sqlite.tenant_bm25 import query_stems, term_docs

SHORT = 3  # FTS5's Porter stemmer leaves shorter tokens as they are


def _in(values: Sequence[object]) -> str:
    return ",".join("?" * len(values))


def index_terms(conn: Connection, words: Sequence[str]) -> list[str]:
    """The words' index terms. Terms under 3 characters are left out when a longer one
    remains: FTS5 does not stem them, so another Porter stemmer may conflate them
    differently ("us" is "u" to Python's), and leaving a term out only widens the
    filter."""
    terms = query_stems(conn, list(words))
    long = [t for t in terms if len(t) >= SHORT]
    return long or terms


def matching_docs(
    conn: Connection,
    tenant: str,
    spaces: Sequence[str],
    words: Sequence[str],
    after: int,
    limit: int,
) -> list[int]:
    """Row ids above `after` (at most `limit`, ascending) of the tenant's indexed (active)
    memories in `spaces` holding every index term of `words`."""
    terms = index_terms(conn, words)
    if not terms or not spaces:
        return []
    scopes = [
        row[0]
        for row in conn.execute(
            f"SELECT id FROM text_scopes WHERE tenant = ? AND space IN ({_in(spaces)})",
            [tenant, *spaces],
        )
    ]
    if not scopes:
        return []
    counts = term_docs(conn, scopes, terms)
    if any(not counts.get(term) for term in terms):
        return []  # a term no memory of these spaces holds
    rarest, *others = sorted(terms, key=lambda term: counts[term])
    sql = (
        f"SELECT p.doc FROM text_postings p WHERE p.scope IN ({_in(scopes)})"
        " AND p.term = ? AND p.doc > ?"
    )
    params: list[object] = [*scopes, rarest, after]
    for term in others:
        sql += (
            " AND EXISTS (SELECT 1 FROM text_postings q WHERE q.scope = p.scope"
            " AND q.term = ? AND q.doc = p.doc)"
        )
        params.append(term)
    sql += " ORDER BY p.doc LIMIT ?"
    params.append(limit)
    return [row[0] for row in conn.execute(sql, params)]
