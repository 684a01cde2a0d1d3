"""Query embedding cost by batch size, single- vs multi-threaded ONNX session.

The query batcher (memory_core/query_batcher.py) takes its window and batch bound from
these numbers: what one ONNX call costs for 1, 4, 8, 16 and 32 short queries, per call
and per text, with an intra-op thread pool of one and of every core.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

SIZES = (1, 4, 8, 16, 32)
QUERY = "What do you remember about {a} and {b}, and what should I avoid next time? ({i})"
TOPICS = ["tea", "rust", "lisbon", "chess", "piano", "taxes", "hiking", "jazz", "sourdough"]


def _texts(n: int, offset: int) -> list[str]:
    return [
        QUERY.format(a=TOPICS[(offset + i) % 9], b=TOPICS[(offset + 2 * i) % 9], i=offset + i)
        for i in range(n)
    ]


def run(model_dir: Any = None, repeats: int = 30, sizes: tuple[int, ...] = SIZES) -> dict:
    from fastembed import TextEmbedding

    from memory_core.embedder import DEFAULT_MODEL_NAME, assemble_default_model

    path = str(model_dir or assemble_default_model())
    sessions = {
        "1 thread": TextEmbedding(DEFAULT_MODEL_NAME, specific_model_path=path, threads=1),
        "all cores": TextEmbedding(DEFAULT_MODEL_NAME, specific_model_path=path, threads=None),
    }
    rows: list[dict[str, Any]] = []
    for label, model in sessions.items():
        list(model.embed(_texts(4, 0), batch_size=64))  # warm up
        for size in sizes:
            times = []
            for r in range(repeats):
                texts = _texts(size, r * size)
                started = time.perf_counter()
                list(model.embed(texts, batch_size=64))
                times.append((time.perf_counter() - started) * 1000)
            p50 = statistics.median(times)
            rows.append(
                {
                    "session": label,
                    "batch": size,
                    "call_ms_p50": round(p50, 2),
                    "per_text_ms": round(p50 / size, 2),
                }
            )
            print(f"  {label:9} batch {size:2}: {p50:6.2f} ms ({p50 / size:.2f} ms a text)")
    return {
        "setup": f"all-MiniLM-L6-v2 int8 ONNX (fastembed), {repeats} calls per cell, median.",
        "rows": rows,
    }


if __name__ == "__main__":
    run()
