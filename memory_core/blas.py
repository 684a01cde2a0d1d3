"""One BLAS thread per caller: numpy's vector products in recall are small and
memory-bound, and OpenBLAS's own worker threads spin-wait for work. In a server whose
other threads (the event loop, ONNX, SQLite readers) already fill the cores, a 10k x 384
matrix-vector product took 12 ms with OpenBLAS's default two threads against 0.7-1.3 ms
with one, measured on the 2-core machine under load. Called by the processes that
serve or measure recall (`memrelay serve`, the benchmarks), not on import: a library
should not change its host's thread settings behind its back.
"""

from __future__ import annotations

from typing import Any

_LIMITS: list[Any] = []  # kept alive: the limit holds while the object lives


def single_threaded_blas() -> None:
    """Limit every loaded BLAS library (OpenBLAS, MKL, ...) to one thread, once."""
    if _LIMITS:
        return
    import numpy  # noqa: F401  (loads numpy's BLAS so threadpoolctl can find it)
    from threadpoolctl import threadpool_limits

    _LIMITS.append(threadpool_limits(limits=1, user_api="blas"))
