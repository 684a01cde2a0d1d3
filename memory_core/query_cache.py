"""Recent recall-query vectors, so a repeated query is not embedded again.

Keys are tuples chosen by the query batcher: (model, text), or (model, tenant, text)
for an embedder whose vectors depend on their call companions (memory_core/
query_batcher.py). Least recently used entries go first; every caller that hits an
entry shares one read-only array.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np


class QueryCache:
    """The most recent query vectors, keyed by (model, exact text); thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, ...], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, ...]) -> np.ndarray | None:
        with self._lock:
            vector = self._items.get(key)
            if vector is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return vector

    def put(self, key: tuple[str, ...], vector: np.ndarray) -> None:
        if self.size <= 0:
            return
        vector = np.array(vector, dtype=np.float32)
        vector.flags.writeable = False  # shared by every caller that hits it
        with self._lock:
            self._items[key] = vector
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: tuple[str, ...]) -> bool:
        return key in self._items
