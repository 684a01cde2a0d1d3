"""A faster copy of the embedding model for recall queries, derived locally.

Why: the query embedding is the largest step of a recall (issue 16). The packaged
all-MiniLM-L6-v2 stores int8 weights that ONNX Runtime turns back into float32 when it
loads them, so every query runs float32 matrix products (~8.5 ms for a short query on
one core here). The same weights quantised dynamically (int8 weights and activations,
`onnxruntime.quantization.quantize_dynamic`) run the query in about half the time. Its
vectors are close to the exact model's (cosine ~0.995 for a query), so memories keep
the vectors the exact model gave them (no re-embedding, the database's embedder is
unchanged) and only queries use this copy: LoCoMo recall measured the same within
noise (docs/benchmarks.md). Nothing is downloaded: the copy is built once from the
packaged file (a few seconds) into the model cache folder, under a name that hashes
its source, and reused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from memory_core.errors import ModelNotInstalled

log = logging.getLogger("memrelay.embedder")
_LOCK = threading.Lock()
QUERY_MODEL_FILE = "model.onnx"
# How the copy is made; part of its folder's name, so a changed recipe builds anew.
RECIPE = "dynamic-int8-per-channel-fused-v3"


def dynamic_query_model(source_dir: Path, cache_dir: Path | None = None) -> Path:
    """The folder of the dynamically quantised copy of `source_dir`'s model.onnx (its
    tokenizer files linked beside it), built on first need: beside `source_dir`, or in
    `cache_dir` (the user's model cache) when that folder is not writable (a model baked
    into a read-only image location)."""
    source = (source_dir / "model.onnx").resolve()
    if not source.is_file():
        raise ModelNotInstalled(f"no model.onnx in {source_dir}")
    stat = source.stat()
    key = hashlib.sha256(
        f"{RECIPE}:{source}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()[:16]
    name = f"{source_dir.name}-query-{key}"
    from memory_core.embedder import default_cache_dir  # the embedder imports this lazily

    places = [source_dir.parent / name, (cache_dir or default_cache_dir()) / name]
    with _LOCK:
        for target in places:
            if (target / QUERY_MODEL_FILE).is_file():
                return _linked(source_dir, target)
        failure: OSError | None = None
        for target in places:
            try:
                _build(source, target)
            except OSError as exc:  # not writable here: the next place
                failure = exc
                continue
            return _linked(source_dir, target)
    raise ModelNotInstalled(f"cannot write the query model copy anywhere: {failure}")


def _linked(source_dir: Path, target: Path) -> Path:
    """`target` with `source_dir`'s tokenizer files linked into it."""
    for item in source_dir.iterdir():
        if item.name != "model.onnx" and not item.name.startswith("."):
            _link(item.resolve(), target / item.name)
    return target


def _build(source: Path, target: Path) -> None:
    """Fold the packaged graph's weight arithmetic into float32 weights (ONNX Runtime's
    basic optimisation, saved), fuse its GELUs (ONNX Runtime's transformer optimiser),
    keep its residual sums out of SkipLayerNormalization (`_residual_sums`), then
    quantise it dynamically, weights per output channel (per tensor, query vectors were
    at cosine ~0.97 to the exact ones; per channel ~0.995, about as fast); moved into
    place whole."""
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:  # quantize_dynamic needs the `onnx` package
        raise ModelNotInstalled("the query model needs the onnx package: pip install onnx") from exc
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        folded = Path(work) / "folded.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        folded = _residual_sums(_fused(folded))
        quantised = Path(work) / QUERY_MODEL_FILE
        hint = _DropHint()
        logging.getLogger().addFilter(hint)  # its advice to pre-process is not for us
        try:
            quantize_dynamic(
                str(folded), str(quantised), weight_type=QuantType.QInt8, per_channel=True
            )
        finally:
            logging.getLogger().removeFilter(hint)
        os.replace(quantised, target / QUERY_MODEL_FILE)  # other processes see it whole


def _fused(folded: Path) -> Path:
    """`folded` with BERT's GELU subgraphs (and its bias) fused into single operators, or
    `folded` itself when the optimiser cannot read it (the copy is then ~7% slower). Not
    its layer norms into SkipLayerNormalization: see `_residual_sums`."""
    fused = folded.with_name("fused.onnx")
    try:
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        options = FusionOptions("bert")
        options.enable_skip_layer_norm = False
        options.enable_bias_skip_layer_norm = False
        # 0 heads and size: read from the graph (its attention is not fused either way)
        model = optimize_model(
            str(folded),
            model_type="bert",
            num_heads=0,
            hidden_size=0,
            opt_level=1,
            optimization_options=options,
        )
        model.save_model_to_file(str(fused))
    except Exception as exc:  # an optimiser that fails costs speed, never the copy
        log.warning("query model copy built without fused operators: %s", exc)
        return folded
    return fused


def _residual_sums(model_path: Path) -> Path:
    """`model_path` with each residual Add (two computed inputs, feeding only a
    LayerNormalization) written as the equivalent Sum, or `model_path` itself when the
    graph cannot be read. Why: ONNX Runtime's session fuses Add + LayerNormalization
    into SkipLayerNormalization, whose CPU kernel is a scalar loop about 4x slower than
    its LayerNormalization (42 against 10 us for a 20-token query), which made the
    copy 8-18% slower (docs/benchmarks.md, issue 16 nbits); it fuses only Add."""
    summed = model_path.with_name("summed.onnx")
    try:
        import onnx

        model = onnx.load(str(model_path))
        graph = model.graph
        constants = {t.name for t in graph.initializer}
        constants.update(o for n in graph.node if n.op_type == "Constant" for o in n.output)
        users: dict[str, list[str]] = {}
        for node in graph.node:
            for name in node.input:
                users.setdefault(name, []).append(node.op_type)
        for node in graph.node:
            if (
                node.op_type == "Add"
                and not node.domain
                and not constants.intersection(node.input)
                and users.get(node.output[0]) == ["LayerNormalization"]
            ):
                node.op_type = "Sum"
        onnx.save(model, str(summed))
    except Exception as exc:  # costs speed, never the copy
        log.warning("query model copy built with fused skip layer norms: %s", exc)
        return model_path
    return summed


class _DropHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def _link(source: Path, link: Path) -> None:
    if link.is_symlink() and link.resolve() == source:
        return
    temporary = link.with_name(f".{link.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        temporary.unlink(missing_ok=True)
        try:
            temporary.symlink_to(source)
        except OSError:
            shutil.copyfile(source, temporary)
        os.replace(temporary, link)
    finally:
        temporary.unlink(missing_ok=True)
