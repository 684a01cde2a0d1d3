"""An int8 copy of a tenant's vectors, for an exact nearest-neighbour scan that reads a
quarter of the bytes.

Why: recall's vector scan is memory-bound. At 10k 384-float vectors (15 MB) it costs
~0.4 ms with a warm cache and ~0.8-1 ms under load, when the embedding model and the
other requests have pushed the matrix out of the cache. The same vectors in int8 (one
scale per row) are 3.8 MB, and ONNX Runtime's integer matrix product (VNNI kernels)
scans them in ~0.1-0.15 ms, cold or warm.

The answer stays exact: each int8 score comes with a bound on its error
(|q.v - q'.v'| <= |q - q'| |v| + |q'| |v - v'|, every norm stored or computed), the k
best int8 candidates are scored in float32 to get a threshold, and every row whose
int8 score plus its bound reaches that threshold is scored in float32 too. Only rows
that cannot be in the top k are left unscored (`vector_view._top_bounded`).

Layout: columns of blocks (dimension x BLOCK, int8), as the product wants the stored
side contiguous and column-major; a new block is appended when one fills, so growing
never copies.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

BLOCK = 2048  # vectors a block; the last block is scanned whole (~8 us a 1000 columns,
# ~8 us a call: 2048 wastes little and calls few)
EPSILON = 1e-5  # float32 rounding in the scores and norms, added to every bound

_SESSION: Any = None
_SESSION_LOCK = threading.Lock()


# The scan's ONNX model: one MatMulInteger, uint8 query [1, K] x int8 block [K, N] ->
# int32 [1, N], opset 13, serialised (tests/test_vector_cache.py rebuilds it with
# onnx.helper and compares). Kept as bytes because importing `onnx` takes ~1 s.
MODEL = bytes.fromhex(
    "080812086d656d72656c61793a5c0a180a01710a0162120179220d4d61744d756c496e7465676572"
    "1209696e74385f7363616e5a110a0171120c0a0a080212060a0208010a005a0f0a0162120a0a0808"
    "0312040a000a0062110a0179120c0a0a080612060a0208010a0042040a00100d"
)


def _session() -> Any:
    """One tiny ONNX Runtime session shared by every tenant; `run` is thread-safe and
    releases the GIL."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            _SESSION = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])
        return _SESSION


class Int8Scan:
    """Int8 rows (one scale each) with what the error bound needs, indexed like the
    float32 matrix they copy."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.blocks: list[np.ndarray] = []
        self.scale = np.zeros(0, dtype=np.float32)  # float row ~= scale * int8 row
        self.colsum = np.zeros(0, dtype=np.int32)  # sum of the int8 row (zero point)
        self.norm = np.zeros(0, dtype=np.float32)  # |v|
        self.error = np.zeros(0, dtype=np.float32)  # |v - scale * int8 row|
        self.max_norm = 0.0  # at least every row's (a cleared row never lowers them)
        self.max_error = 0.0

    def _ensure(self, rows: int) -> None:
        while len(self.blocks) * BLOCK < rows:
            self.blocks.append(np.zeros((self.dim, BLOCK), dtype=np.int8))
        capacity = len(self.blocks) * BLOCK
        if len(self.scale) < capacity:
            for name in ("scale", "colsum", "norm", "error"):
                old = getattr(self, name)
                grown = np.zeros(capacity, dtype=old.dtype)
                grown[: len(old)] = old
                setattr(self, name, grown)

    def set(self, start: int, rows: np.ndarray) -> None:
        """Quantise `rows` (float32, one vector a row) into positions start, start+1..."""
        count = len(rows)
        if count == 0:
            return
        self._ensure(start + count)
        rows = np.asarray(rows, dtype=np.float32)
        peak = np.abs(rows).max(axis=1)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        ints = np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8)
        end = start + count
        self.scale[start:end] = scale
        self.colsum[start:end] = ints.sum(axis=1, dtype=np.int32)
        self.norm[start:end] = np.linalg.norm(rows, axis=1)
        self.error[start:end] = np.linalg.norm(rows - ints * scale[:, None], axis=1)
        self.max_norm = max(self.max_norm, float(self.norm[start:end].max()))
        self.max_error = max(self.max_error, float(self.error[start:end].max()))
        position = start
        while position < end:
            block, column = divmod(position, BLOCK)
            take = min(end - position, BLOCK - column)
            offset = position - start
            self.blocks[block][:, column : column + take] = ints[offset : offset + take].T
            position += take

    def clear(self, index: int) -> None:
        """A dropped row: zero, so its (masked) score is 0 with no error."""
        if index < len(self.scale):
            self.set(index, np.zeros((1, self.dim), dtype=np.float32))

    def scores(self, query: np.ndarray, n: int) -> Scored:
        """Approximate scores of rows 0..n-1, with what bounds their errors."""
        query = np.asarray(query, dtype=np.float32)
        peak = float(np.abs(query).max())
        q_scale = peak / 127.0 if peak > 0 else 1.0
        q_ints = np.clip(np.rint(query / q_scale), -127, 127)
        dequantised = q_ints * q_scale
        shifted = (q_ints + 128).astype(np.uint8)[None, :]  # uint8 with zero point 128
        session = _session()
        blocks = self.blocks[: -(-n // BLOCK)]
        parts = [session.run(None, {"q": shifted, "b": block})[0][0] for block in blocks]
        dots = (np.concatenate(parts) if len(parts) > 1 else parts[0])[:n]
        dots -= 128 * self.colsum[:n]
        return Scored(
            dots.astype(np.float32) * (self.scale[:n] * np.float32(q_scale)),
            float(np.linalg.norm(query - dequantised)),
            float(np.linalg.norm(dequantised)),
            self,
        )


@dataclass(slots=True)
class Scored:
    """Int8 scores of one query; `bound(rows)` caps |float32 score - int8 score|."""

    approx: np.ndarray
    query_error: float  # |q - q'|
    query_norm: float  # |q'|
    scan: Int8Scan

    def bound(self, rows: np.ndarray) -> np.ndarray:
        scan = self.scan
        return self.query_error * scan.norm[rows] + self.query_norm * scan.error[rows] + EPSILON

    @property
    def max_bound(self) -> float:
        """At least `bound` of every row (float32 rounding of `bound` included)."""
        scan = self.scan
        worst = self.query_error * scan.max_norm + self.query_norm * scan.max_error
        return worst * (1 + 1e-6) + 2 * EPSILON
