"""Turn results.json into report.md (tables, targets met or missed) and PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TARGETS = {
    "off_p50": 2.0,
    "off_p99": 10.0,
    "on_p50": 12.0,
    "litellm_ratio": 1.5,
    "locomo_turn_any10": 0.80,
    "locomo_session_all5": 0.88,
    "scaling_100k_p50": 10.0,
    "scaling_1m_p50": 60.0,
    "restart_1m_s": 5.0,
}


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        out.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return [*out, ""]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def write_report(results: dict[str, Any], out: Path) -> None:
    lines = ["# memrelay benchmark report", ""]
    m = results.get("machine", {})
    lines += [
        f"Machine: {m.get('cores')} cores, {m.get('memory_gb')} GiB, {m.get('system')},"
        f" Python {m.get('python')}."
        + (" **Quick mode** (small sizes)." if results.get("quick") else ""),
        "",
    ]
    for name, render in (
        ("embedding", _embedding),
        ("overhead", _overhead),
        ("locomo", _locomo),
        ("scaling", _scaling),
        ("extraction", _extraction),
    ):
        if name in results:
            lines += render(results[name], out)
    (out / "report.md").write_text("\n".join(lines))


def _overhead(r: dict[str, Any], out: Path) -> list[str]:
    lines = ["## Proxy overhead", "", r.get("setup", ""), ""]
    rows = []
    for c, modes in r["by_concurrency"].items():
        for mode, v in modes.items():
            rows.append(
                [
                    c,
                    mode,
                    v["ttfb_ms"]["p50"],
                    v["ttfb_ms"]["p99"],
                    v["total_ms"]["p50"],
                    v["total_ms"]["p99"],
                    v["rps"],
                    v.get("added_ttfb_p50_ms", ""),
                    v.get("added_ttfb_p99_ms", ""),
                    v.get("errors", 0),
                    _ok_rate(v),
                    _status_mix(v),
                    "" if v.get("mean_recalled") is None else v["mean_recalled"],
                    v["recall_wait_ms"]["p50"] if v.get("recall_wait_ms") else "",
                    v["recall_wait_ms"]["p99"] if v.get("recall_wait_ms") else "",
                ]
            )
    lines += table(
        [
            "concurrency",
            "mode",
            "TTFB p50 ms",
            "TTFB p99 ms",
            "total p50 ms",
            "total p99 ms",
            "req/s",
            "added TTFB p50",
            "added TTFB p99",
            "errors",
            "recall ok",
            "recall status (X-Memrelay-Recall-Status)",
            "memories injected (mean)",
            "recall wait p50 ms",
            "recall wait p99 ms",
        ],
        rows,
    )
    lines += [
        "Recall status counts come from each response's X-Memrelay-Recall-Status; a"
        " **memory skipped** row had recalls that passed their budget or failed, so those"
        " answers went out without memories (memory off rows say `off` by request); a"
        " **vector side skipped** row had recalls predicted to miss their budget waiting"
        " for the query embedding, so they searched full text only (`text_only`, not"
        " counted as ok).",
        "",
    ]
    lines += _fairness(r.get("fairness"))
    lines += ["Targets:", ""]
    for check in r.get("checks", []):
        lines.append(
            f"- {check['what']}: {check['value']} (target {check['target']}): "
            f"{verdict(check['ok'])}"
        )
    lines.append("")
    _plot_overhead(r, out)
    lines += ["![overhead by concurrency](overhead.png)", ""]
    for note in r.get("notes", []):
        lines.append(f"- {note}")
    return [*lines, ""]


def _embedding(r: dict[str, Any], out: Path) -> list[str]:
    rows = [[v["session"], v["batch"], v["call_ms_p50"], v["per_text_ms"]] for v in r["rows"]]
    return [
        "## Query embedding cost by batch size",
        "",
        r.get("setup", ""),
        "",
        *table(["ONNX session", "batch", "call p50 ms", "per text ms"], rows),
    ]


def _ok_rate(v: dict[str, Any]) -> str:
    rate = v.get("recall_ok_rate")
    if rate is None:
        return "n/a (off)" if (v.get("recall_status") or {}).get("off") else "n/a"
    return f"{rate:.1%}"


def _status_mix(v: dict[str, Any]) -> str:
    statuses = v.get("recall_status") or {}
    mix = ", ".join(f"{status} {count}" for status, count in statuses.items())
    if v.get("text_only"):
        mix += f" — **vector side skipped** for {v['text_only']} (full-text recall only)"
    if v.get("memory_skipped"):
        mix += f" — **memory skipped** for {v['memory_skipped']}"
    return mix or "n/a"


def _fairness(f: dict[str, Any] | None) -> list[str]:
    if not f:
        return []
    rows = [
        [name, v["clients"], v["ttfb_ms"]["p50"], v["ttfb_ms"]["p99"], _ok_rate(v), _status_mix(v)]
        for name, v in f.items()
        if name != "setup"
    ]
    return [
        "Fairness (one tenant flooding):",
        "",
        f.get("setup", ""),
        "",
        *table(
            ["run", "clients", "TTFB p50 ms", "TTFB p99 ms", "recall ok", "recall status"], rows
        ),
    ]


def _locomo(r: dict[str, Any], out: Path) -> list[str]:
    from bench.locomo import render

    return render(r, TARGETS)


def _scaling(r: dict[str, Any], out: Path) -> list[str]:
    lines = ["## Recall latency as memory grows", "", r.get("setup", ""), ""]
    rows = []
    for backend in ("sqlite", "postgres"):
        for size, v in r.get(backend, {}).items():
            rows.append(
                [
                    backend,
                    int(size),
                    v["store_only_ms"]["p50"],
                    v["store_only_ms"]["p99"],
                    v["with_embedding_ms"]["p50"],
                    v["with_embedding_ms"]["p99"],
                    round(v["end_to_end"]["added_p50_ms"], 2),
                    round(v["end_to_end"]["added_p99_ms"], 2),
                    v["db_mb"],
                    v["peak_rss_mb"],
                    v.get("postgres_server_rss_mb", ""),
                    v["fill_s"],
                ]
            )
    lines += table(
        [
            "backend",
            "memories",
            "store p50 ms",
            "store p99 ms",
            "with embedding p50",
            "p99",
            "e2e added p50 ms",
            "e2e added p99 ms",
            "db MB",
            "peak RSS MB",
            "PG server RSS MB",
            "fill s",
        ],
        rows,
    )
    for backend in ("sqlite", "postgres"):
        data = r.get(backend, {})
        for size, target in (("100000", "scaling_100k_p50"), ("1000000", "scaling_1m_p50")):
            if size in data:
                p50 = data[size]["store_only_ms"]["p50"]
                lines.append(
                    f"- {backend} {int(size):,}: store-level p50 {p50:.1f} ms (target"
                    f" {TARGETS[target]}): {verdict(p50 <= TARGETS[target])}"
                )
    restarts = [
        [int(size), mode, v["open_s"], v["ready_s"], v["loaded_from"]]
        for size, data in r.get("sqlite", {}).items()
        for mode, v in data.get("restart", {}).items()
        if mode != "model_load_s"
    ]
    if restarts:
        lines += [
            "",
            "SQLite restart: seconds from opening the store to the first recall within a 200 ms"
            " budget, plus the embedding model's load (timed apart: the bench process keeps"
            " one loaded), with the vector snapshot and without it:",
            "",
            *table(
                ["memories", "start from", "store open s", "recall ready s", "vectors read from"],
                restarts,
            ),
        ]
        for size, data in r.get("sqlite", {}).items():
            v = data.get("restart", {}).get("snapshot")
            if v and int(size) >= 1_000_000:
                target = TARGETS["restart_1m_s"]
                lines.append(
                    f"- sqlite {int(size):,}: recall ready {v['ready_s']} s after a restart"
                    f" (target {target}): {verdict(v['ready_s'] <= target)}"
                )
    lines.append("")
    _plot_scaling(r, out)
    lines += ["![latency against memory count](scaling.png)", ""]
    for note in r.get("notes", []):
        lines.append(f"- {note}")
    return [*lines, ""]


def _extraction(r: dict[str, Any], out: Path) -> list[str]:
    lines = ["## Extraction throughput (instant fake LLM)", "", r.get("setup", ""), ""]
    rows = [[k, v["jobs"], v["seconds"], v["exchanges_per_s"]] for k, v in r["runs"].items()]
    lines += table(["setup", "exchanges", "seconds", "exchanges/s"], rows)
    for note in r.get("notes", []):
        lines.append(f"- {note}")
    return [*lines, ""]


def _plot_overhead(r: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    concurrencies = list(r["by_concurrency"])
    modes = sorted({m for v in r["by_concurrency"].values() for m in v})
    for mode in modes:
        xs = [c for c in concurrencies if mode in r["by_concurrency"][c]]
        left.plot(
            xs, [r["by_concurrency"][c][mode]["ttfb_ms"]["p50"] for c in xs], "o-", label=mode
        )
        right.plot(xs, [r["by_concurrency"][c][mode]["rps"] for c in xs], "o-", label=mode)
    left.set(title="time to first byte, p50", xlabel="concurrency", ylabel="ms")
    right.set(title="throughput", xlabel="concurrency", ylabel="requests/s")
    left.legend()
    fig.tight_layout()
    fig.savefig(out / "overhead.png", dpi=110)
    plt.close(fig)


def _plot_scaling(r: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for backend in ("sqlite", "postgres"):
        data = r.get(backend, {})
        if not data:
            continue
        sizes = sorted(int(s) for s in data)
        for key, style in (("store_only_ms", "o-"), ("with_embedding_ms", "s--")):
            ax.plot(
                sizes,
                [data[str(s)][key]["p50"] for s in sizes],
                style,
                label=f"{backend} {key.replace('_ms', '').replace('_', ' ')} p50",
            )
    ax.set_xscale("log")
    ax.set(
        title="recall latency against memory count", xlabel="memories in the tenant", ylabel="ms"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=110)
    plt.close(fig)
