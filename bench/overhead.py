"""Proxy overhead: direct vs memrelay (memory off / on) vs the LiteLLM proxy.

Every server is a process of its own on loopback: the paced fake upstream, one
`memrelay serve` (its SQLite file pre-filled with 10k memories in the tenant), and
`litellm --config` from a separate virtual environment pointed at the same fake. An
asyncio client here keeps `concurrency` streamed requests in flight and records time
to first body byte and total time for each; requests per second is completed requests
over wall time. Modes alternate in rounds so drift on a shared machine hits all alike.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.common import CHUNKS, PACE_S, chat_body, pct, summary
from bench.processes import LITELLM_KEY, start_fake, start_litellm, start_memrelay

QUIET_TENANT = "quiet"
TOPICS = ["tea", "rust", "lisbon", "chess", "piano", "taxes", "hiking", "jazz", "sourdough"]


async def load(
    url: str,
    headers: dict[str, str],
    concurrency: int,
    requests: int,
    seed: int,
    tag: str = "q",
) -> dict[str, Any]:
    """`requests` streamed completions, `concurrency` in flight; per-request timings and
    what memrelay says recall did (X-Memrelay-Recall-Status, X-Memrelay-Recalled)."""
    rng = random.Random(seed)
    # Every text is distinct (an unseen reference word the full-text side drops), so the
    # query-embedding cache never answers for the benchmark: each request is embedded.
    texts = [
        f"What do you remember about {rng.choice(TOPICS)} and {rng.choice(TOPICS)}?"
        f" (ref {tag}s{seed}n{i})"
        for i in range(requests)
    ]
    first: list[float] = []
    total: list[float] = []
    statuses: Counter[str] = Counter()
    recalled: list[int] = []
    recall_ms: list[float] = []
    wait_ms: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        queue = list(reversed(texts))

        async def worker() -> None:
            nonlocal errors
            while queue:
                text = queue.pop()
                started = time.perf_counter()
                try:
                    async with client.stream(
                        "POST", url + "/v1/chat/completions", headers=headers, json=chat_body(text)
                    ) as response:
                        got_first = None
                        async for _chunk in response.aiter_raw():
                            if got_first is None:
                                got_first = time.perf_counter()
                        if response.status_code != 200 or got_first is None:
                            errors += 1
                            continue
                        status = response.headers.get("x-memrelay-recall-status")
                        if status is not None:
                            statuses[status] += 1
                            recalled.append(int(response.headers.get("x-memrelay-recalled", 0)))
                            recall_ms.append(float(response.headers.get("x-memrelay-recall-ms", 0)))
                            wait = response.headers.get("x-memrelay-recall-wait-ms")
                            if wait is not None:
                                wait_ms.append(float(wait))
                except httpx.HTTPError:
                    errors += 1
                    continue
                first.append((got_first - started) * 1000)
                total.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {
        "first": first,
        "total": total,
        "errors": errors,
        "wall": wall,
        "statuses": statuses,
        "recalled": recalled,
        "recall_ms": recall_ms,
        "wait_ms": wait_ms,
    }


def run(
    work: Path,
    embedder: Any,
    concurrencies: list[int],
    requests: int,
    memories: int,
    litellm: Path | None,
    rounds: int = 2,
) -> dict[str, Any]:
    from bench.scaling import Filler, warm_up
    from memory_core.backends import make_store

    db = work / "overhead.db"

    async def prefill() -> None:
        store = make_store(db, embedder)
        await store.start()
        filler = Filler(embedder, base=min(2000, memories))
        await filler.fill_to(store, memories)
        quiet = Filler(embedder, base=min(2000, memories))
        await quiet.fill_to(store, max(memories // 10, 100), tenant=QUIET_TENANT)
        await store.close()

    asyncio.run(prefill())
    notes: list[str] = []
    with ExitStack() as stack:
        fake = start_fake()
        stack.callback(fake.stop)
        memrelay = start_memrelay(db, fake.url)
        stack.callback(memrelay.stop)
        tenant = {"X-Memrelay-Tenant": "big", "X-Memrelay-Read-Spaces": "default,work"}
        with httpx.Client(timeout=60) as client:
            warm_up(client, memrelay.url, "big", ["default", "work"])
        modes: dict[str, tuple[str, dict[str, str]]] = {
            "direct": (fake.url, {}),
            "memrelay memory off": (memrelay.url, {**tenant, "X-Memrelay-Memory": "off"}),
            "memrelay memory on": (memrelay.url, {**tenant, "X-Memrelay-Memory": "read"}),
        }
        if litellm is not None:
            try:
                proxy = start_litellm(litellm, fake.url, work)
                stack.callback(proxy.stop)
                modes["litellm"] = (proxy.url, {"Authorization": f"Bearer {LITELLM_KEY}"})
            except RuntimeError as exc:
                notes.append(f"LiteLLM did not start: {str(exc)[:300]}")
        else:
            notes.append("LiteLLM left out (quick mode or --litellm skip).")
        by_concurrency: dict[str, dict[str, Any]] = {}
        for concurrency in concurrencies:
            raw: dict[str, dict[str, Any]] = {
                m: {
                    "first": [],
                    "total": [],
                    "errors": 0,
                    "wall": 0.0,
                    "done": 0,
                    "statuses": Counter(),
                    "recalled": [],
                    "wait_ms": [],
                }
                for m in modes
            }
            # Texts are unique per concurrency, round and phase (the tag and seed name
            # them): a text seen before would find its vector cached and skip the query
            # embedding, which is what is measured. (Until 2026-12-01 every concurrency
            # reused the c=1 texts, so c=16 and c=64 memory on ran with cached vectors.)
            for url, headers in modes.values():  # warm-up: connections, caches
                asyncio.run(load(url, headers, concurrency, concurrency * 2, 1, f"w{concurrency}"))
            for round_ in range(rounds):
                for mode, (url, headers) in modes.items():
                    got = asyncio.run(
                        load(
                            url, headers, concurrency, requests // rounds, round_, f"c{concurrency}"
                        )
                    )
                    for key in ("first", "total", "statuses", "recalled", "wait_ms"):
                        raw[mode][key] += got[key]
                    raw[mode]["errors"] += got["errors"]
                    raw[mode]["wall"] += got["wall"]
                    raw[mode]["done"] += len(got["first"])
            by_concurrency[str(concurrency)] = _summarise(raw)
            line = ", ".join(
                f"{m} {v['ttfb_ms']['p50']:.1f} ms / {v['rps']:.0f} rps"
                + (
                    f" / ok {v['recall_ok_rate']:.1%}"
                    if v.get("recall_ok_rate") is not None
                    else ""
                )
                for m, v in by_concurrency[str(concurrency)].items()
            )
            print(f"  c={concurrency}: {line}", flush=True)
        fairness = _fairness(memrelay.url, max(concurrencies), requests)
    return {
        "setup": (
            f"Fake upstream streams {CHUNKS + 3} SSE events, {PACE_S * 1000:.0f} ms apart;"
            f" {requests} requests per mode and concurrency in {rounds} alternating rounds;"
            f" memory on: {memories:,} memories in the tenant (SQLite, vector cache)."
        ),
        "by_concurrency": by_concurrency,
        "fairness": fairness,
        "checks": _checks(by_concurrency) + _fairness_checks(fairness),
        "notes": notes,
    }


def _fairness(url: str, concurrency: int, requests: int) -> dict[str, Any]:
    """A flooding tenant and a quiet one at once (memory on): does the quiet tenant's
    recall stay within budget? Its run alone at the same small concurrency is the base."""
    quiet_clients = 4 if concurrency >= 16 else 1
    flood_clients = max(concurrency - quiet_clients, 1)
    spaces = "default,work"
    flood = {"X-Memrelay-Tenant": "big", "X-Memrelay-Read-Spaces": spaces}
    quiet = {"X-Memrelay-Tenant": QUIET_TENANT, "X-Memrelay-Read-Spaces": spaces}
    quiet_requests = max(requests // 8, 10)
    flood_requests = quiet_requests * flood_clients // quiet_clients  # both run as long

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        return await asyncio.gather(
            load(url, flood, flood_clients, flood_requests, seed=5, tag="f"),
            load(url, quiet, quiet_clients, quiet_requests, seed=6, tag="u"),
        )

    alone = asyncio.run(load(url, quiet, quiet_clients, quiet_requests, seed=7, tag="a"))
    flooded, beside = asyncio.run(both())
    out: dict[str, Any] = {
        "setup": (
            f"Memory on. {flood_clients} clients of tenant `big` ({flood_requests} requests)"
            f" while {quiet_clients} clients of tenant `{QUIET_TENANT}` send"
            f" {quiet_requests}; the quiet tenant alone at {quiet_clients} clients as base."
        )
    }
    for name, got in (("quiet alone", alone), ("quiet beside flood", beside), ("flood", flooded)):
        out[name] = {
            "clients": flood_clients if name == "flood" else quiet_clients,
            "ttfb_ms": summary(got["first"]),
            "errors": got["errors"],
            **recall_summary(got["statuses"], got["recalled"]),
        }
    print(
        "  fairness: quiet ok "
        + ", ".join(f"{k} {v['recall_ok_rate']}" for k, v in out.items() if k != "setup"),
        flush=True,
    )
    return out


def _fairness_checks(fairness: dict[str, Any]) -> list[dict[str, Any]]:
    beside = fairness.get("quiet beside flood", {})
    if beside.get("recall_ok_rate") is None:
        return []
    return [
        _check("quiet tenant beside a flood: recall ok-rate", beside["recall_ok_rate"], 0.99, ">="),
        _check(
            "quiet tenant beside a flood: recall within budget, ok or text_only",
            beside.get("recall_answered_rate") or 0.0,
            0.99,
            ">=",
        ),
    ]


def _summarise(raw: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    direct = raw["direct"]["first"]
    for mode, r in raw.items():
        out[mode] = {
            "ttfb_ms": summary(r["first"]),
            "total_ms": summary(r["total"]),
            "rps": round(r["done"] / r["wall"], 1) if r["wall"] else 0.0,
            "errors": r["errors"],
        }
        if mode != "direct" and r["first"]:
            out[mode]["added_ttfb_p50_ms"] = round(
                statistics.median(r["first"]) - statistics.median(direct), 3
            )
            out[mode]["added_ttfb_p99_ms"] = round(pct(r["first"], 99) - pct(direct, 99), 3)
        out[mode].update(recall_summary(r["statuses"], r["recalled"]))
        if r["wait_ms"]:  # time recalls waited for their turn before their budget began
            out[mode]["recall_wait_ms"] = summary(r["wait_ms"])
    return out


def recall_summary(statuses: Counter[str], recalled: list[int]) -> dict[str, Any]:
    """What recall did: status counts, the share `ok`, memories injected per request, and
    whether memory was skipped (recall passed its budget or failed) for any request."""
    total = sum(statuses.values())
    if not total:
        return {"recall_status": {}, "recall_ok_rate": None, "mean_recalled": None}
    skipped = sum(n for status, n in statuses.items() if status in ("timeout", "error"))
    asked = total - statuses.get("off", 0)  # memory off by request: no recall to judge
    text_only = statuses.get("text_only", 0)
    return {
        "recall_status": dict(sorted(statuses.items())),
        # strict: only full (vector + text) recalls count; text_only is reported apart
        "recall_ok_rate": round(statuses.get("ok", 0) / asked, 4) if asked else None,
        "recall_answered_rate": round((asked - skipped) / asked, 4) if asked else None,
        "mean_recalled": round(sum(recalled) / max(len(recalled), 1), 2),
        "memory_skipped": skipped,
        "text_only": text_only,
    }


def _checks(by_concurrency: dict[str, Any]) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    one = by_concurrency.get("1", {})
    if one:
        off = one["memrelay memory off"]
        on = one["memrelay memory on"]
        checks += [
            _check("c=1 memory off: added TTFB p50 (ms)", off["added_ttfb_p50_ms"], 2.0, "<="),
            _check("c=1 memory off: added TTFB p99 (ms)", off["added_ttfb_p99_ms"], 10.0, "<="),
            _check("c=1 memory on: added TTFB p50 (ms)", on["added_ttfb_p50_ms"], 12.0, "<="),
        ]
    for c, ok_target in (("16", 0.99), ("64", 0.95)):
        row = by_concurrency.get(c)
        if not row:
            continue
        on, off = row["memrelay memory on"], row["memrelay memory off"]
        checks.append(
            _check(f"c={c} memory on: recall ok-rate", on["recall_ok_rate"] or 0.0, ok_target, ">=")
        )
        checks.append(
            _check(
                f"c={c} memory on: recall within budget, ok or text_only (not the issue's target)",
                on.get("recall_answered_rate") or 0.0,
                ok_target,
                ">=",
            )
        )
        if c == "16":
            added = on["ttfb_ms"]["p50"] - off["ttfb_ms"]["p50"]
            checks.append(
                _check("c=16 memory on: TTFB p50 over memory off (ms)", added, 40.0, "<=")
            )
            ratio = on["rps"] / max(off["rps"], 1e-9)
            checks.append(_check("c=16 req/s, memory on / memory off", ratio, 0.6, ">="))
    top = by_concurrency.get("64")
    if top and "litellm" in top:
        ratio = top["memrelay memory off"]["rps"] / max(top["litellm"]["rps"], 1e-9)
        checks.append(_check("c=64 req/s, memrelay (memory off) / LiteLLM", ratio, 1.5, ">="))
        ratio_on = top["memrelay memory on"]["rps"] / max(top["litellm"]["rps"], 1e-9)
        checks.append(_check("c=64 req/s, memrelay (memory on) / LiteLLM", ratio_on, 1.5, ">="))
    return checks


def _check(what: str, value: float, target: float, op: str) -> dict[str, Any]:
    ok = value <= target if op == "<=" else value >= target
    return {"what": what, "value": round(value, 3), "target": f"{op} {target}", "ok": ok}
