"""End to end on a real model: the embedded llama.cpp default (SmolLM2-135M) behind
memrelay, driven by the official openai SDK. The model is tiny: these tests assert the
pipeline, not the wisdom of its answers."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from memory_core.sqlite.jobs import SQLiteJobs
from proxy.local_llm import LocalLlamaServer
from proxy.settings import Settings
from proxy.wiring import build_app
from tests.conftest import SeedStore
from tests.recording_forwarder import RecordingForwarder
from tests.servers import ServedApp

pytestmark = pytest.mark.llm


@pytest.fixture(scope="module")
def llama():
    server = LocalLlamaServer(ctx=4096, parallel=2)
    asyncio.run(server.start())
    yield server
    asyncio.run(server.close())


@pytest.fixture
def behind_recorder(llama, tmp_path, embedder):
    """memrelay -> recording hop -> llama.cpp; returns (memrelay, recorder, seed)."""
    recorder = RecordingForwarder(llama.url)
    servers = []

    def start(**overrides):
        hop = ServedApp(recorder).__enter__()
        overrides.setdefault("db", tmp_path / "e2e.db")
        settings = Settings(upstream_url=hop.url + "/v1", **overrides)
        from memory_core import SQLiteStore

        memrelay = ServedApp(
            build_app(settings, store=SQLiteStore(settings.db, embedder))
        ).__enter__()
        servers.extend([memrelay, hop])
        return memrelay, recorder, SeedStore(settings.db, embedder)

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def test_embedded_default_serves_streaming_and_plain_chat(tmp_path, embedder):
    from memory_core import SQLiteStore

    settings = Settings(db=tmp_path / "default.db", extraction_workers=0)
    assert settings.upstream_url is None
    with ServedApp(build_app(settings, store=SQLiteStore(settings.db, embedder))) as server:
        assert httpx.get(server.url + "/memrelay/readyz").status_code == 200
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        models = client.models.list()
        assert models.data and models.data[0].id.endswith(".gguf")
        reply = client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": "Say hello."}], max_tokens=12
        )
        assert reply.choices[0].message.content
        chunks = list(
            client.chat.completions.create(
                model="local",
                messages=[{"role": "user", "content": "Count to three."}],
                max_tokens=12,
                stream=True,
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_remembered_constraint_reaches_llama(behind_recorder):
    memrelay, recorder, _ = behind_recorder(extraction_workers=0)
    remembered = httpx.post(
        memrelay.url + "/memrelay/v1/memories",
        json={"content": "Always answer in French", "kind": "constraint"},
    )
    assert remembered.status_code == 201
    client = openai.OpenAI(base_url=memrelay.url + "/v1", api_key="none", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="local",
        messages=[{"role": "user", "content": "How should you answer me?"}],
        max_tokens=12,
    )
    assert raw.headers["x-memrelay-recall-status"] == "ok"
    assert raw.parse().choices[0].message.content
    system = recorder.chat_bodies()[-1]["messages"][0]
    assert system["role"] == "system" and "- Always answer in French" in system["content"]


def test_extraction_runs_on_the_real_model_and_the_queue_drains(behind_recorder):
    memrelay, recorder, seed = behind_recorder(
        extraction_workers=1,
        extraction_max_tokens=160,
        extraction_max_attempts=2,
        extraction_retry_base_seconds=0.1,
    )
    client = openai.OpenAI(base_url=memrelay.url + "/v1", api_key="none", max_retries=0)
    for text in (
        "My name is Ada and I live in Lisbon.",
        "I prefer tea over coffee.",
        "My favourite colour is green.",
    ):
        client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": text}], max_tokens=8
        )
    jobs = SQLiteJobs(seed.store)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        counts = seed.run(jobs.job_counts())
        if sum(counts.values()) == 3 and counts["pending"] == counts["leased"] == 0:
            break
        time.sleep(0.5)
    assert counts["done"] + counts["dead"] == 3, counts
    extraction_calls = [b for b in recorder.chat_bodies() if "memrelay-extraction" in str(b)]
    assert extraction_calls
    assert extraction_calls[0]["response_format"]["type"] == "json_schema"
    for job in seed.run(jobs.list_jobs("default", limit=10)):
        assert job.status in ("done", "dead")
        if job.status == "done":
            assert job.payload is None and "outcomes" in job.result
    seed.close()
