"""BM25's constants and IDF, one definition for both backends.

SQLite (memory_core/sqlite/tenant_bm25.py) and Postgres (memory_core/postgres/
text_stats.py) compute BM25 in memrelay's own code over each tenant's statistics; both
read k1 and b from here, so the two backends can never rank with different constants.

The IDF is FTS5's (`ln((N - df + 0.5) / (df + 0.5))`, clamped to MIN_IDF when not
positive). k1 and b were chosen on LoCoMo's tuning half and checked on the held-out half
(docs/benchmarks.md, "BM25 constants, a finer sweep"); FTS5's own `bm25()` uses
FTS5_K1 and FTS5_B, and a test pins that the SQLite scorer run with those equals FTS5's
scores exactly.
"""

from __future__ import annotations

import math

FTS5_K1 = 1.2  # FTS5's bm25() constants
FTS5_B = 0.75
K1 = 2.0  # memrelay's, both backends
B = 0.1
MIN_IDF = 1e-6  # FTS5 clamps a non-positive IDF to this


def idf(rows: int, hits: int) -> float:
    """FTS5's BM25 IDF over `rows` documents of which `hits` hold the term, with its clamp."""
    value = math.log((rows - hits + 0.5) / (hits + 0.5)) if rows > 0 else 0.0
    return value if value > 0.0 else MIN_IDF
