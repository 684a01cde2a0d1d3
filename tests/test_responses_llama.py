"""The Responses API through memrelay on the real embedded llama.cpp (its server serves
`/v1/responses`, streamed and not). Asserts the pipeline, not the tiny model's wisdom."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from memory_core import SQLiteStore
from memory_core.sqlite.db import connect
from proxy.local_llm import LocalLlamaServer
from proxy.settings import Settings
from proxy.wiring import build_app
from tests.recording_forwarder import RecordingForwarder
from tests.servers import ServedApp

pytestmark = pytest.mark.llm


@pytest.fixture(scope="module")
def llama():
    server = LocalLlamaServer(ctx=2048, parallel=1)
    asyncio.run(server.start())
    yield server
    asyncio.run(server.close())


def test_responses_get_memory_and_are_learned_on_llama(llama, tmp_path, embedder):
    recorder = RecordingForwarder(llama.url)
    settings_db = tmp_path / "llama-responses.db"
    with ServedApp(recorder) as hop:
        settings = Settings(upstream_url=hop.url + "/v1", db=settings_db, extraction_workers=0)
        app = build_app(settings, store=SQLiteStore(settings.db, embedder))
        with ServedApp(app) as memrelay:
            remembered = httpx.post(
                memrelay.url + "/memrelay/v1/memories",
                json={"content": "Always answer in French", "kind": "constraint"},
            )
            assert remembered.status_code == 201
            client = openai.OpenAI(
                base_url=memrelay.url + "/v1", api_key="none", max_retries=0, timeout=300
            )
            raw = client.responses.with_raw_response.create(
                model="local",
                input="How should you answer me?",
                instructions="Be brief.",
                max_output_tokens=12,
            )
            assert raw.headers["x-memrelay-recall-status"] == "ok"
            assert raw.headers["x-memrelay-memory-status"] == "queued"
            assert raw.parse().output_text
            sent = [json.loads(b) for p, b in recorder.bodies if p == "/v1/responses"]
            assert sent[-1]["instructions"].startswith("Be brief.\n\n[memrelay:constraints]")
            assert "- Always answer in French" in sent[-1]["instructions"]
            # llama.cpp's events carry no output_index, which the SDK's stream() helper
            # needs; plain iteration of a stream=True response works.
            events = list(
                client.responses.create(
                    model="local", input="Count to three.", max_output_tokens=8, stream=True
                )
            )
            assert events[-1].type == "response.completed"
            conn = connect(settings_db)
            try:
                rows = conn.execute(
                    "SELECT payload FROM jobs WHERE draft = false ORDER BY seq"
                ).fetchall()
            finally:
                conn.close()
            payloads = [json.loads(p) for (p,) in rows]
            assert [p["user"] for p in payloads] == [
                "How should you answer me?",
                "Count to three.",
            ]
            assert all(p["assistant"] for p in payloads)
