"""Prometheus metrics (prometheus-client), one registry per app."""

from __future__ import annotations

from collections import Counter as PyCounter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

HEALTH_GAUGES = (
    ("memrelay_extraction_workers", "workers", "Extraction workers configured"),
    ("memrelay_extraction_workers_alive", "workers_alive", "Extraction workers running"),
    ("memrelay_extraction_backlog_jobs", "backlog", "Pending, leased and draft jobs"),
    (
        "memrelay_extraction_oldest_pending_seconds",
        "oldest_pending_seconds",
        "Age of the oldest job waiting or running",
    ),
)
EMBEDDING_COUNTERS = (
    ("memrelay_query_embeddings", "query_texts", "Recall queries embedded by this process"),
    (
        "memrelay_query_embedding_calls",
        "query_calls",
        "Model calls that embedded them (queries per call: the batching achieved)",
    ),
    ("memrelay_query_cache_hits", "cache_hits", "Recall queries answered by the vector cache"),
    (
        "memrelay_query_shared_waits",
        "shared_waits",
        "Recall queries that shared an identical query's embedding in flight",
    ),
)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def route_of(path: str) -> str:
    """A small, fixed label set: never a raw path (ids would explode cardinality)."""
    if path in ("/v1/chat/completions", "/chat/completions"):
        return "chat_completions"
    if path == "/v1/responses":
        return "responses"
    if path.startswith("/memrelay/v1/"):
        return "admin"
    if path == "/memrelay/mcp":
        return "mcp"
    if path.startswith("/memrelay/"):
        return "health"
    if path == "/metrics":
        return "metrics"
    return "passthrough"


class _Snapshot(Collector):
    """Values read from the database when /metrics is scraped (refreshed just before)."""

    def __init__(self) -> None:
        self.queue: dict[str, int] = {}
        self.memories: dict[str, int] = {}
        self.jobs: Callable[[], PyCounter[str]] | None = None
        self.health: dict[str, Any] = {}
        self.embedding: Callable[[], dict[str, int]] | None = None
        self.search: Callable[[], dict[str, Any] | None] | None = None  # the search process

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "memrelay_extraction_queue_jobs", "Extraction jobs by status", labels=["status"]
        )
        for status, count in sorted(self.queue.items()):
            depth.add_metric([status], count)
        yield depth
        memories = GaugeMetricFamily("memrelay_memories", "Memories by status", labels=["status"])
        for status, count in sorted(self.memories.items()):
            memories.add_metric([status], count)
        yield memories
        processed = CounterMetricFamily(
            "memrelay_extraction_jobs", "Jobs processed by this process", labels=["outcome"]
        )
        counts = self.jobs() if self.jobs else PyCounter()
        for outcome in ("done", "failed", "dead", "errors", "lease_lost"):
            processed.add_metric([outcome], counts.get(outcome, 0))
        yield processed
        yield CounterMetricFamily(
            "memrelay_extraction_worker_restarts",
            "Extraction worker tasks that ended and were restarted",
            value=counts.get("restarts", 0),
        )
        yield CounterMetricFamily(
            "memrelay_extraction_pruned_jobs",
            "Done jobs deleted after their retention, by this process",
            value=counts.get("pruned", 0),
        )
        embedding = self.embedding() if self.embedding else {}
        for name, key, doc in EMBEDDING_COUNTERS:
            if key in embedding:
                yield CounterMetricFamily(name, doc, value=embedding[key])
        search = self.search() if self.search else None
        if search is not None:
            yield GaugeMetricFamily(
                "memrelay_search_process_up",
                "1 while recall's search process runs; 0: recalls search in-process",
                value=1.0 if search["up"] else 0.0,
            )
            yield CounterMetricFamily(
                "memrelay_search_process_restarts",
                "Times the search process exited and was started again",
                value=search["restarts"],
            )
        for name, key, doc in HEALTH_GAUGES:
            if key in self.health:
                yield GaugeMetricFamily(name, doc, value=float(self.health[key]))


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "memrelay_requests", "HTTP requests", ["route", "method", "status"], registry=r
        )
        self.upstream = Histogram(
            "memrelay_upstream_seconds",
            "Upstream exchange time (to the last byte)",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttfb = Histogram(
            "memrelay_upstream_ttfb_seconds",
            "Upstream time to response headers",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "memrelay_overhead_seconds",
            "Time inside memrelay before the upstream",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.recall = Histogram(
            "memrelay_recall_seconds",
            "Recall time on chat completions",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.recall_wait = Histogram(
            "memrelay_recall_wait_seconds",
            "Time recalls waited for their turn (recall_concurrency) before their budget began",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.recall_status = Counter("memrelay_recall", "Recall outcomes", ["status"], registry=r)
        self.injected = Counter(
            "memrelay_memories_injected", "Memories injected into prompts", registry=r
        )
        self.learning = Counter(
            "memrelay_learning_exchanges",
            "Chat completions by X-Memrelay-Memory-Status (queued, skipped, shed, duplicate, off)",
            ["status"],
            registry=r,
        )
        self.drafts = Counter(
            "memrelay_learning_drafts",
            "Jobs written before the answer: finished with it, dropped (answer failed or"
            " cut), or failed (could not be finished)",
            ["outcome"],
            registry=r,
        )
        self.snapshot = _Snapshot()
        r.register(self.snapshot)

    def render(self) -> bytes:
        return generate_latest(self.registry)
