"""The faster query copy of the embedding model (memory_core/query_model.py): built
locally from the packaged model, used for recall queries only; memories, learning's
lookups and forget-by-query keep the exact model's vectors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from memory_core import FastEmbedEmbedder, NewMemory, RecallQuery

QUERIES = [
    "What do I like to drink in the morning?",
    "Which city did we move to last year?",
    "Remind me what my daughter is allergic to.",
    "How should code you write for me be formatted?",
]
MEMORIES = [
    "I drink green tea every morning, never coffee.",
    "We moved to Lisbon in 2025.",
    "My daughter Ana is allergic to peanuts.",
    "Always use four spaces and type hints in Python code you write for me.",
    "The quarterly report is due on Friday.",
    "My car is a blue 2014 Corolla.",
]


@pytest.fixture(scope="module")
def exact() -> FastEmbedEmbedder:
    return FastEmbedEmbedder(query_model="exact")


def test_queries_use_the_copy_and_agree_with_the_exact_model(embedder: Any, exact: Any) -> None:
    assert embedder.query_model == "dynamic"
    fast = embedder.embed_queries(QUERIES)
    slow = exact.embed_queries(QUERIES)
    assert fast.shape == slow.shape == (len(QUERIES), 384)
    assert np.allclose(np.linalg.norm(fast, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(fast * slow, axis=1)
    assert not np.allclose(fast, slow)  # the copy really runs
    assert cosines.min() > 0.9, cosines
    # Each query finds the same memory first with either query vector.
    docs = exact.embed(MEMORIES)
    assert list(np.argmax(fast @ docs.T, axis=1)) == list(np.argmax(slow @ docs.T, axis=1))


def test_memories_are_always_embedded_exactly(embedder: Any, exact: Any) -> None:
    assert np.array_equal(embedder.embed(MEMORIES), exact.embed(MEMORIES))
    assert np.array_equal(embedder.embed(MEMORIES[:1]), exact.embed(MEMORIES[:1]))


def test_the_copy_is_built_once_beside_the_packaged_model(embedder: Any) -> None:
    from memory_core.embedder import assemble_default_model
    from memory_core.query_model import dynamic_query_model

    source = assemble_default_model()
    folder = dynamic_query_model(source)
    model = folder / "model.onnx"
    assert model.is_file() and folder.parent == source.parent
    assert (folder / "tokenizer.json").resolve() == (source / "tokenizer.json").resolve()
    built = model.stat().st_mtime_ns
    assert dynamic_query_model(source) == folder
    assert model.stat().st_mtime_ns == built  # reused, not rebuilt
    assert model.stat().st_size < (source / "model.onnx").resolve().stat().st_size


def test_an_unknown_query_model_is_refused() -> None:
    with pytest.raises(ValueError, match="query_model"):
        FastEmbedEmbedder(query_model="fast")


def test_exact_and_background_recalls_use_the_exact_vectors(store: Any, run: Any, exact: Any):
    """Similarity floors that decide what is erased (forget-by-query) or superseded
    (reconciliation) are judged on the exact model's vectors; the proxy's recall on the
    copy's."""
    added = run(store.add_many("acme", "default", [NewMemory(m) for m in MEMORIES]))
    target = added[0]
    text = QUERIES[0]
    truth_exact = float(exact.embed_queries([text])[0] @ exact.embed([target.content])[0])
    fast_vector = store.embedder.embed_queries([text])[0]
    truth_fast = float(fast_vector @ exact.embed([target.content])[0])
    assert abs(truth_exact - truth_fast) > 1e-4  # the two really differ here

    def similarity(**options: Any) -> float:
        query = RecallQuery("acme", ["default"], text, top_k=6, use_text=False, **options)
        found = {r.memory.id: r for r in run(store.recall(query))}
        return found[target.id].breakdown["vector_similarity"]

    assert similarity() == pytest.approx(truth_fast, abs=2e-3)
    assert similarity(exact_vector=True) == pytest.approx(truth_exact, abs=2e-3)
    assert similarity(background=True) == pytest.approx(truth_exact, abs=2e-3)


def test_the_copy_goes_to_the_cache_when_beside_the_model_is_not_writable(
    tmp_path: Any, monkeypatch: Any, caplog: Any
) -> None:
    """A model baked into a read-only place (a container image) gets its copy in the
    user's cache; with nowhere to write, the embedder says so and embeds exactly."""
    import logging
    import shutil

    import memory_core.embedder as embedder_module
    from memory_core.embedder import assemble_default_model
    from memory_core.query_model import dynamic_query_model

    source = tmp_path / "models" / "minilm"
    source.mkdir(parents=True)
    for item in assemble_default_model().iterdir():
        (source / item.name).symlink_to(item.resolve())
    cache = tmp_path / "cache"
    monkeypatch.setattr(embedder_module, "default_cache_dir", lambda: cache)
    beside = dynamic_query_model(source)
    assert beside.parent == source.parent  # writable: built beside the model
    shutil.rmtree(beside)
    beside.write_text("a file where the folder would go")  # (root ignores chmod)
    cached = dynamic_query_model(source)
    assert cached.parent == cache
    assert (cached / "model.onnx").is_file() and (cached / "tokenizer.json").is_file()

    shutil.rmtree(cached)
    cached.write_text("nowhere to write")
    embedder = FastEmbedEmbedder(source, query_model="dynamic")
    with caplog.at_level(logging.WARNING, logger="memrelay.embedder"):
        vectors = embedder.embed_queries(QUERIES[:2])
    assert embedder.query_model == "exact"
    exact = FastEmbedEmbedder(source, query_model="exact").embed_queries(QUERIES[:2])
    assert np.allclose(vectors, exact)
    assert any("exact model" in r.getMessage() for r in caplog.records)


def test_the_copy_keeps_its_layer_norms_out_of_skip_layer_norm(tmp_path: Any) -> None:
    """ONNX Runtime's CPU SkipLayerNormalization is about 4x slower than its
    LayerNormalization (a scalar loop): the copy's residual sums are Sum nodes, so that
    neither its build nor the session fuses them (docs/benchmarks.md, issue 16 nbits)."""
    import onnx
    import onnxruntime as ort

    from memory_core.embedder import assemble_default_model
    from memory_core.query_model import dynamic_query_model

    source = tmp_path / "models" / "minilm"
    source.mkdir(parents=True)
    for item in assemble_default_model().iterdir():
        (source / item.name).symlink_to(item.resolve())
    copy = dynamic_query_model(source)  # built now, from this code
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "as-run.onnx")
    ort.InferenceSession(str(copy / "model.onnx"), options, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "as-run.onnx")).graph.node]
    assert "SkipLayerNormalization" not in ops
    assert ops.count("LayerNormalization") == 13  # embeddings' and 2 per layer
    assert "BiasGelu" in ops and "DynamicQuantizeMatMul" in ops  # still fused, quantised
