"""Do standing rules reach the prompt? Recall of instructions, preferences and mistakes.

    PYTHONPATH=$PWD .venv/bin/python -m bench.rules [--distractors 10000] [--out FILE]

The cases (bench/data/rules_cases.json, written for this benchmark) are standing rules
of three kinds (constraint = an instruction, preference, error = a mistake to avoid),
each with one or two later requests where it applies but which share few or no words
with it ("Always answer in British English spelling" / "Write a short note about the
colour of our new logo"). All rules are stored in one tenant among distractor facts:
every LoCoMo turn (read from ../shared/bench-data as bench/locomo.py does, never
copied; kind `fact`), topped up to `--distractors` with bench/scaling.py's synthetic
sentences ("The user prefers green tea on Mondays", also `fact`).

Each request is recalled as BM25 alone, vectors alone, the hybrid, and the hybrid with
the standing-rule path (memory_core/standing_rules.py); scored any@5 and any@10 (the
request's rule among the first k of a recall with top_k = k) per kind. The cases are
split by index, fixed here: even indexes tune, odd ones are held out; the path's
settings were chosen on the tuning half only. A control group of LoCoMo questions
(turn evidence any@k) shows what the path costs facts, and the path's own time is
measured per request (store level).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.locomo import CATEGORIES, DEFAULT_DATA, evidence_ids, turns
from memory_core import NewMemory, RecallQuery
from memory_core.backends import make_store
from memory_core.standing_rules import (
    StandingPolicy,
    cached_query_vector,
    candidates,
    merge,
    with_standing_rules,
)

CASES = Path(__file__).resolve().parent / "data" / "rules_cases.json"
TENANT = "rules"
SPACE = "default"
KS = (5, 10)
GROUPS = {"constraint": "instruction", "preference": "preference", "error": "mistake"}
MODES = {"bm25": {"use_vector": False}, "vector": {"use_text": False}, "hybrid": {}}
# Fixed split by case index: tuning = even, held-out = odd.
HALVES = {"tuning": 0, "held_out": 1}
CONTROL_QUESTIONS = 200  # LoCoMo questions (all conversations), a sample fixed by seed
# Policies compared on the tuning half; the first is the shipped default. `--grid`
# scores a wider grid (the search that chose the default, on the tuning half only).
POLICIES = {
    "default": StandingPolicy(),
    "slots=1": StandingPolicy(slots=1),
    "slots=2": StandingPolicy(slots=2),
    "slots=4": StandingPolicy(slots=4),
    "floor=0.15": StandingPolicy(min_similarity=0.15),
    "floor=0.35": StandingPolicy(min_similarity=0.35),
    "margin=0.1": StandingPolicy(margin=0.1),
    "no margin": StandingPolicy(margin=1.0),
}
GRID = {
    f"slots={slots} floor={floor} margin={margin}": StandingPolicy(slots, floor, 3, margin)
    for slots in (1, 2, 3, 4)
    for floor in (0.0, 0.1, 0.15, 0.2, 0.25, 0.3)
    for margin in (0.0, 0.1, 0.2, 0.3, 1.0)
}


def load_cases(path: Path = CASES) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["cases"]


def half_of(index: int) -> str:
    return "tuning" if index % 2 == HALVES["tuning"] else "held_out"


async def fill(
    store: Any, embedder: Any, distractors: int, samples: list[dict[str, Any]]
) -> dict[str, str]:
    """Distractor facts: LoCoMo turns, then synthetic sentences up to `distractors`.
    Returns memory id -> LoCoMo dia id (prefixed with the conversation index)."""
    mapping: dict[str, str] = {}
    added = 0
    for index, sample in enumerate(samples):
        pairs = turns(sample["conversation"])
        for start in range(0, len(pairs), 256):
            chunk = pairs[start : start + 256]
            items = [NewMemory(text, kind="fact", source="import") for _, text in chunk]
            memories = await store.add_many(TENANT, SPACE, items)
            for memory, (dia_id, _) in zip(memories, chunk, strict=True):
                mapping[memory.id] = f"{index}/{dia_id}"
            added += len(items)
    if added < distractors:
        from bench.scaling import Filler

        filler = Filler(embedder, base=min(2000, distractors - added))
        while filler.done < distractors - added:
            _, items, block = filler.next_block(distractors - added)
            for item in items:
                item.kind = "fact"
            await store.add_embedded(TENANT, SPACE, items, block)
    return mapping


def control_questions(samples: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """LoCoMo questions with turn evidence, across all conversations (a fixed sample)."""
    out = []
    for index, sample in enumerate(samples):
        known = {d for d, _ in turns(sample["conversation"])}
        for qa in sample["qa"]:
            if qa.get("category") not in CATEGORIES:
                continue
            evidence, _ = evidence_ids(qa.get("evidence") or [], known)
            if evidence:
                out.append((qa["question"], [f"{index}/{e}" for e in evidence]))
    random.Random(17).shuffle(out)
    return out[:CONTROL_QUESTIONS]


async def recall_all(store: Any, text: str) -> dict[str, Any]:
    """Every mode's ranked ids for one request, plus the path's candidates and time."""
    out: dict[str, Any] = {}
    for mode, options in MODES.items():
        query = RecallQuery(TENANT, [SPACE], text, top_k=max(KS), **options)
        out[mode] = await store.recall(query)
    query = RecallQuery(TENANT, [SPACE], text, top_k=max(KS))
    # What the proxy's recall adds, timed as it runs there (the default policy).
    started = time.perf_counter()
    await with_standing_rules(store, query, out["hybrid"], StandingPolicy())
    out["path_ms"] = (time.perf_counter() - started) * 1000
    # Every candidate any policy could use, for scoring them all offline.
    vector = cached_query_vector(store, query)
    out["candidates"] = await candidates(store, query, vector, max(KS) + 4)
    return out


def ranked(recalled: dict[str, Any], mode: str, k: int, policy: StandingPolicy) -> list[str]:
    if mode != "hybrid+rules":
        return [r.memory.id for r in recalled[mode][:k]]
    merged = merge(recalled["hybrid"][:k], recalled["candidates"], k, policy)
    return [r.memory.id for r in merged]


def score_rules(
    results: list[tuple[int, str, str, dict[str, Any]]], policy: StandingPolicy
) -> dict[str, Any]:
    """{half: {group: {mode: {any@k: rate}, 'n': requests}}}."""
    acc: dict[str, dict[str, dict[str, Any]]] = {}
    for index, group, rule_id, recalled in results:
        for bucket in (group, "all"):
            cell = acc.setdefault(half_of(index), {}).setdefault(bucket, {"n": 0})
            cell["n"] += 1
            for mode in [*MODES, "hybrid+rules"]:
                for k in KS:
                    hit = rule_id in ranked(recalled, mode, k, policy)
                    key = f"{mode} any@{k}"
                    cell[key] = cell.get(key, 0) + hit
    return {
        half: {
            group: {k: (v if k == "n" else round(v / cell["n"], 3)) for k, v in cell.items()}
            for group, cell in groups.items()
        }
        for half, groups in acc.items()
    }


def score_control(
    results: list[tuple[list[str], dict[str, Any]]], mapping: dict[str, str], policy: Any
) -> dict[str, float]:
    out: dict[str, float] = {}
    for evidence, recalled in results:
        for mode in ("hybrid", "hybrid+rules"):
            for k in KS:
                top = {mapping.get(i) for i in ranked(recalled, mode, k, policy)}
                key = f"{mode} any@{k}"
                out[key] = out.get(key, 0) + any(e in top for e in evidence)
    return {k: round(v / max(len(results), 1), 3) for k, v in out.items()}


def run(
    embedder: Any,
    distractors: int = 10_000,
    data: Path = DEFAULT_DATA,
    policies: dict[str, StandingPolicy] | None = None,
) -> dict[str, Any]:
    """The whole benchmark on a temporary SQLite file (LoCoMo turns if `data` exists)."""
    samples = json.loads(data.read_text()) if data.exists() else []
    return asyncio.run(run_async(embedder, distractors, samples, policies or POLICIES))


async def run_async(
    embedder: Any,
    distractors: int,
    samples: list[dict[str, Any]],
    policies: dict[str, StandingPolicy],
) -> dict[str, Any]:
    cases = load_cases()
    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(Path(tmp) / "rules.db", embedder)
        await store.start()
        try:
            started = time.perf_counter()
            mapping = await fill(store, embedder, distractors, samples)
            rules = await store.add_many(
                TENANT, SPACE, [NewMemory(c["rule"], kind=c["kind"]) for c in cases]
            )
            fill_s = time.perf_counter() - started
            total = (await store.stats(TENANT))["total"]
            results = []
            for index, (case, rule) in enumerate(zip(cases, rules, strict=True)):
                for request in case["requests"]:
                    recalled = await recall_all(store, request)
                    results.append((index, GROUPS[case["kind"]], rule.id, recalled))
            control = [(ev, await recall_all(store, q)) for q, ev in control_questions(samples)]
        finally:
            await store.close()
    path_ms = [r[3]["path_ms"] for r in results] + [r[1]["path_ms"] for r in control]
    return {
        "setup": (
            f"{len(cases)} rules ({sum(len(c['requests']) for c in cases)} requests) in one"
            f" tenant of {total} memories (LoCoMo turns and synthetic facts as distractors),"
            f" filled in {fill_s:.0f} s; {len(control)} LoCoMo questions as the facts control."
        ),
        "policies": {
            name: {
                "rules": score_rules(results, policy),
                "control": score_control(control, mapping, policy),
            }
            for name, policy in policies.items()
        },
        "path_ms": {
            "p50": round(statistics.median(path_ms), 3),
            "p90": round(statistics.quantiles(path_ms, n=10)[-1], 3),
            "n": len(path_ms),
        },
        "memories": total,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def render(result: dict[str, Any]) -> list[str]:
    lines = ["## Standing rules: instructions, preferences, mistakes", "", result["setup"], ""]
    default = result["policies"]["default"]
    modes = [*MODES, "hybrid+rules"]
    for half in ("tuning", "held_out"):
        lines += [
            f"{half} half, any@5 / any@10:",
            "",
            "| group | requests | " + " | ".join(modes) + " |",
            "|---|---|" + "---|" * len(modes),
        ]
        for group in (*GROUPS.values(), "all"):
            cell = default["rules"][half].get(group)
            if not cell:
                continue
            cells = [f"{cell[f'{m} any@5']:.3f} / {cell[f'{m} any@10']:.3f}" for m in modes]
            lines.append(f"| {group} | {cell['n']} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "Policies on the tuning half (all groups, hybrid+rules any@5 / any@10) and their"
        " cost to facts (LoCoMo control, hybrid any@10 without the path"
        f" {default['control'].get('hybrid any@10', 0):.3f}):",
        "",
        "| policy | tuning any@5 / any@10 | held-out any@5 / any@10 | control any@5 / any@10 |",
        "|---|---|---|---|",
    ]
    for name, scored in result["policies"].items():
        tune, held = scored["rules"]["tuning"]["all"], scored["rules"]["held_out"]["all"]
        control = scored["control"]
        lines.append(
            f"| {name} | {tune['hybrid+rules any@5']:.3f} / {tune['hybrid+rules any@10']:.3f}"
            f" | {held['hybrid+rules any@5']:.3f} / {held['hybrid+rules any@10']:.3f}"
            f" | {control.get('hybrid+rules any@5', 0):.3f} /"
            f" {control.get('hybrid+rules any@10', 0):.3f} |"
        )
    cost = result["path_ms"]
    lines += [
        "",
        f"The path's own time per request (`with_standing_rules` at the default policy,"
        f" store level, after the hybrid recall, on"
        f" {result['memories']} memories): p50 {cost['p50']} ms, p90 {cost['p90']} ms"
        f" ({cost['n']} requests); load average at the end"
        f" {', '.join(map(str, result.get('load_average', [])))}.",
        "",
    ]
    return lines


def locomo_with_path(embedder: Any, policy: StandingPolicy) -> dict[str, Any]:
    """bench/locomo.py's run with every recall going through the standing-rule path, as
    the proxy's recall does (the check that facts' recall does not get worse)."""
    from bench import locomo
    from memory_core.sqlite.store import SQLiteStore

    class WithPath(SQLiteStore):
        async def recall(self, query: RecallQuery) -> list[Any]:
            results = await super().recall(query)
            return await with_standing_rules(self, query, results, policy)

    original = locomo.make_store
    locomo.make_store = lambda db, model, **options: WithPath(Path(db), model, **options)
    try:
        return locomo.run(embedder)
    finally:
        locomo.make_store = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distractors", type=int, default=10_000)
    parser.add_argument(
        "--data",
        type=Path,
        default=Path(os.environ.get("MEMRELAY_LOCOMO", DEFAULT_DATA)),
        help="locomo10.json (default: $MEMRELAY_LOCOMO or ../shared/bench-data)",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    parser.add_argument("--grid", action="store_true", help="score the policy grid too")
    parser.add_argument(
        "--locomo", action="store_true", help="run bench/locomo.py with the path instead"
    )
    parser.add_argument(
        "--query-model",
        choices=["dynamic", "exact"],
        default="dynamic",
        help="the embedder's query session (MEMRELAY_QUERY_MODEL)",
    )
    args = parser.parse_args()
    from memory_core import FastEmbedEmbedder

    def embedder() -> FastEmbedEmbedder:
        return FastEmbedEmbedder(query_model=args.query_model)

    if args.locomo:
        from bench import locomo

        result = locomo_with_path(embedder(), StandingPolicy())
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))
        targets = {"locomo_turn_any10": 0.80, "locomo_session_all5": 0.88}
        print("\n".join(locomo.render(result, targets)))
        return
    policies = {**POLICIES, **GRID} if args.grid else POLICIES
    result = run(embedder(), args.distractors, args.data, policies)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print("\n".join(render(result)))


if __name__ == "__main__":
    main()
