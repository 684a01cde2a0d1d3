"""Run memrelay's benchmarks and write results.json, report.md and PNG plots.

    .venv/bin/python -m bench.run                  # everything (about an hour on 2 cores)
    .venv/bin/python -m bench.run --quick          # a small version of everything (CI smoke)
    .venv/bin/python -m bench.run --sections overhead locomo --out bench/results/x

Sections: embedding (query embedding cost by batch size, one thread vs all cores),
overhead (direct / memrelay memory off / memory on / LiteLLM at concurrency
1, 16, 64), locomo (retrieval quality), scaling (recall latency from 1k to 1M memories,
SQLite and Postgres), extraction (pipeline throughput; Postgres with one and two
replicas). Results of sections run separately into the same folder are merged, and
the report is rebuilt from everything there. Numbers are medians of one run on a
shared machine: compare within a run (ratios), not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

SECTIONS = ("embedding", "overhead", "locomo", "scaling", "extraction")
ROOT = Path(__file__).resolve().parent.parent


def machine() -> dict[str, Any]:
    import psutil

    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "system": platform.platform(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; skips LiteLLM")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "latest")
    parser.add_argument("--litellm", choices=["auto", "skip"], default="auto")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results_file = args.out / "results.json"
    results: dict[str, Any] = json.loads(results_file.read_text()) if results_file.exists() else {}
    results["machine"] = machine()
    results["quick"] = args.quick

    from memory_core import FastEmbedEmbedder
    from memory_core.blas import single_threaded_blas

    single_threaded_blas()  # as `memrelay serve` does: store-level figures match the server's
    embedder = FastEmbedEmbedder()
    embedder.embed(["warm up"])
    pg = None
    if {"scaling", "extraction"} & set(args.sections):
        from tests.postgres import EmbeddedPostgres

        pg = EmbeddedPostgres()
    try:
        with tempfile.TemporaryDirectory(prefix="memrelay-bench-") as tmp:
            work = Path(tmp)
            for section in args.sections:
                started = time.perf_counter()
                print(f"== {section}", flush=True)
                results[section] = run_section(section, args, work, embedder, pg)
                results[section]["seconds"] = round(time.perf_counter() - started, 1)
                results_file.write_text(json.dumps(results, indent=2))
    finally:
        if pg is not None:
            pg.stop()
    from bench.report import write_report

    write_report(results, args.out)
    print(f"results: {results_file}\nreport: {args.out / 'report.md'}")


def run_section(
    section: str, args: argparse.Namespace, work: Path, embedder: Any, pg: Any
) -> dict[str, Any]:
    quick = args.quick
    if section == "embedding":
        from bench import embedding

        return embedding.run(repeats=5 if quick else 30, sizes=(1, 4) if quick else embedding.SIZES)
    if section == "overhead":
        from bench import overhead, processes

        return overhead.run(
            work,
            embedder,
            concurrencies=[1, 4] if quick else [1, 16, 64],
            requests=30 if quick else 400,
            memories=500 if quick else 10_000,
            litellm=None if quick or args.litellm == "skip" else processes.litellm_venv(ROOT),
        )
    if section == "locomo":
        from bench import locomo

        return (
            locomo.run(embedder, conversations=1, questions=40) if quick else locomo.run(embedder)
        )
    if section == "scaling":
        from bench import scaling

        return scaling.run(
            sizes=[1_000, 2_000] if quick else [1_000, 10_000, 100_000, 1_000_000],
            pg_sizes=[1_000] if quick else [100_000, 1_000_000],
            workdir=work,
            embedder=embedder,
            pg=pg,
            query_count=20 if quick else 200,
            e2e_count=10 if quick else 100,
        )
    from bench import extraction

    return extraction.run(work, embedder, pg, jobs=40 if quick else 600)


if __name__ == "__main__":
    main()
