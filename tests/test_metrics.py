"""/metrics: present, Prometheus-formatted, and moving with traffic."""

from __future__ import annotations

import re

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_upstream import Reply


def scrape(server) -> dict[tuple[str, tuple], float]:
    text = httpx.get(server.url + "/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def value(values, name, **labels):
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_after_traffic(fake, memory_proxy):
    server, seed = memory_proxy()
    seed.add("default", "default", "The user likes metrics")
    before = scrape(server)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    for _ in range(3):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "metrics?"}]
        )
    client.models.list()
    fake.script.append(Reply.json({"error": {"message": "no"}}, status=404))
    httpx.get(server.url + "/v1/files/missing")
    after = scrape(server)
    assert (
        value(
            after, "memrelay_requests_total", route="chat_completions", method="POST", status="200"
        )
        - value(
            before, "memrelay_requests_total", route="chat_completions", method="POST", status="200"
        )
        == 3
    )
    assert (
        value(after, "memrelay_requests_total", route="passthrough", method="GET", status="404")
        == 1
    )
    assert value(after, "memrelay_recall_total", status="ok") == 3
    assert value(after, "memrelay_memories_injected_total") == 3
    assert value(after, "memrelay_recall_seconds_count") == 3
    assert value(after, "memrelay_upstream_ttfb_seconds_count", route="chat_completions") == 3
    assert value(after, "memrelay_upstream_seconds_count", route="passthrough") == 2
    assert value(after, "memrelay_overhead_seconds_count", route="chat_completions") == 3
    assert value(after, "memrelay_memories", status="active") == 1
    # The same request thrice is one piece of evidence: one job, two duplicates.
    assert value(after, "memrelay_extraction_queue_jobs", status="pending") == 1  # workers off
    assert value(after, "memrelay_learning_exchanges_total", status="queued") == 1
    assert value(after, "memrelay_learning_exchanges_total", status="duplicate") == 2
    assert value(after, "memrelay_learning_drafts_total", outcome="finished") == 1
    assert ("memrelay_extraction_jobs_total", (("outcome", "done"),)) in after
    # The learning loop's health: no workers here (0 of 0 alive), one job waiting.
    assert value(after, "memrelay_extraction_workers") == 0
    assert value(after, "memrelay_extraction_backlog_jobs") == 1
    assert value(after, "memrelay_extraction_oldest_pending_seconds") >= 0
    # The same query thrice: embedded once in one call, then answered by the cache.
    for name, moved in (
        ("memrelay_query_embeddings_total", 1),
        ("memrelay_query_embedding_calls_total", 1),
        ("memrelay_query_cache_hits_total", 2),
    ):
        assert value(after, name) - value(before, name) == moved, name


def test_metrics_have_no_tenant_or_content_labels(fake, memory_proxy):
    server, seed = memory_proxy()
    seed.add("secret-tenant", "default", "Top secret content")
    httpx.post(
        server.url + "/v1/chat/completions",
        headers={"X-Memrelay-Tenant": "secret-tenant"},
        json={"model": "m", "messages": [{"role": "user", "content": "secret"}]},
    )
    text = httpx.get(server.url + "/metrics").text
    assert "secret" not in text.lower()
    assert re.search(r"^memrelay_requests_total\{", text, re.MULTILINE)
