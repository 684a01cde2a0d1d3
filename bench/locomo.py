"""Retrieval quality on LoCoMo, on a fixed tuning half and a held-out half.

Part of `python -m bench.run` (section `locomo`). The data is read from
../shared/bench-data/locomo10.json beside the project, or $MEMRELAY_LOCOMO.

Every turn of each conversation is stored as a memory in its own tenant ("Speaker:
text", with the session date); each question of categories 1-4 with evidence is
recalled in three modes (BM25 alone, vectors alone, the hybrid) and scored:
recall_any@k (some evidence turn in the top k) and recall_all@k (all of them), at turn
level (evidence ids like D1:3) and session level (D1).

The conversations are split by index, fixed here (`TUNING`, `HELD_OUT`): every
retrieval change is tuned on the tuning half and judged on the held-out half, which
nothing in memory_core was fitted on. The data is CC BY-NC 4.0 and is read from where
the team keeps it, never copied here.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from memory_core import NewMemory, RecallQuery
from memory_core.backends import make_store

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "bench-data" / "locomo10.json"
KS = (1, 5, 10, 20)
MODES = {"bm25": {"use_vector": False}, "vector": {"use_text": False}, "hybrid": {}}
# By conversation index in locomo10.json (conv-26 ... conv-50). The earlier fusion
# tuning used conversations 0-2, so they sit in the tuning half.
TUNING = (0, 1, 2, 3, 4)
HELD_OUT = (5, 6, 7, 8, 9)
HALVES = {"tuning": TUNING, "held_out": HELD_OUT}
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
HEADLINE = (("turn", "recall_any@10"), ("session", "recall_all@5"))
_ID = re.compile(r"^D(\d+):(\d+)$")


def evidence_ids(raw: list[str], known: set[str]) -> tuple[list[str], int]:
    """Normalised evidence ids that exist in the conversation, and how many were dropped."""
    found, dropped = [], 0
    for item in raw:
        for part in re.split(r"[;,\s]+", item.strip()):
            match = _ID.match(part)
            if not match:
                dropped += bool(part)
                continue
            norm = f"D{int(match.group(1))}:{int(match.group(2))}"
            if norm in known:
                found.append(norm)
            else:
                dropped += 1
    return sorted(set(found)), dropped


def session(dia_id: str) -> str:
    return dia_id.split(":")[0]


def turns(conversation: dict[str, Any]) -> list[tuple[str, str]]:
    """(dia id, memory text) for every turn, in order."""
    out = []
    n = 1
    while f"session_{n}" in conversation:
        when = conversation.get(f"session_{n}_date_time", "")
        for turn in conversation[f"session_{n}"]:
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares a photo of {turn['blip_caption']}]"
            out.append((turn["dia_id"], f"{text} ({when})"))
        n += 1
    return out


# `neighbour` options of `run`: how a turn's vector takes in the turn before it (in the
# same session). "text": the two turns embedded as one text; "vector": the turn's own
# vector plus NEIGHBOUR_MIX times the previous turn's, renormalised (no extra embedding).
NEIGHBOURS = ("text", "vector")
NEIGHBOUR_MIX = 0.75  # tuning half: 0.25-1.5 tried, 0.75 best (docs/benchmarks.md)


def previous_in_session(pairs: list[tuple[str, str]]) -> list[int | None]:
    """For each turn, the index of the turn before it in the same session (or None)."""
    return [
        i - 1 if i and session(pairs[i - 1][0]) == session(dia_id) else None
        for i, (dia_id, _) in enumerate(pairs)
    ]


def with_previous(pairs: list[tuple[str, str]]) -> list[str]:
    """Each turn's text preceded by the turn before it in the same session (without its
    date): what `load` embeds with `neighbour="text"`."""
    return [
        text if p is None else f"{pairs[p][1].rsplit(' (', 1)[0]}\n{text}"
        for p, (_, text) in zip(previous_in_session(pairs), pairs, strict=True)
    ]


def mixed_with_previous(pairs: list[tuple[str, str]], vectors: np.ndarray) -> np.ndarray:
    """Each turn's vector plus NEIGHBOUR_MIX times its predecessor's, unit length."""
    out = vectors.copy()
    for i, p in enumerate(previous_in_session(pairs)):
        if p is not None:
            out[i] += NEIGHBOUR_MIX * vectors[p]
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


async def load(
    store: Any, tenant: str, conversation: dict[str, Any], neighbour: str | None = None
) -> dict[str, str]:
    """Store every turn; returns memory id -> dia id. The stored text (and so BM25) is
    always the turn alone; `neighbour` ("text" or "vector") changes only its vector."""
    pairs = turns(conversation)
    items = [NewMemory(text, kind="note", source="import") for _, text in pairs]
    if neighbour is None:
        vectors = None
    elif neighbour == "text":
        vectors = await store.embed(with_previous(pairs))
    elif neighbour == "vector":
        vectors = mixed_with_previous(pairs, await store.embed([text for _, text in pairs]))
    else:
        raise ValueError(f"neighbour: one of {NEIGHBOURS}")
    mapping: dict[str, str] = {}
    for start in range(0, len(items), 256):
        chunk = items[start : start + 256]
        if vectors is None:
            memories = await store.add_many(tenant, "default", chunk)
        else:
            part = vectors[start : start + 256]
            memories = await store.add_embedded(tenant, "default", chunk, part)
        mapping.update({m.id: pairs[start + i][0] for i, m in enumerate(memories)})
    return mapping


def score(ranked: list[str], evidence: list[str], level: str) -> dict[str, float]:
    if level == "session":
        ranked = list(dict.fromkeys(session(d) for d in ranked))
        evidence = sorted({session(d) for d in evidence})
    out = {}
    for k in KS:
        top = set(ranked[:k])
        out[f"any@{k}"] = float(any(e in top for e in evidence))
        out[f"all@{k}"] = float(all(e in top for e in evidence))
    return out


def select(samples: list[dict[str, Any]], per_half: int | None) -> dict[str, list[int]]:
    """Conversation indexes of each half present in the data (the first `per_half`)."""
    return {
        half: [i for i in indexes if i < len(samples)][:per_half]
        for half, indexes in HALVES.items()
    }


def run(
    embedder: Any,
    conversations: int | None = None,
    questions: int | None = None,
    data: Path | None = None,
    database: str | None = None,
    neighbour: str | None = None,
) -> dict:
    """Score every mode on both halves (on a temporary SQLite file, or `database`, a
    Postgres URL).

    `conversations` caps the conversations per half, `questions` the questions per
    conversation (quick runs); `neighbour` ("text" or "vector", see NEIGHBOURS) makes each
    turn's vector take in the turn before it. Returns {'halves': {half: {'scores': ...,
    'categories': ..., 'questions': n}}, 'scores': the held-out scores, 'setup': ...}.
    """
    data = data or Path(os.environ.get("MEMRELAY_LOCOMO", DEFAULT_DATA))
    if not data.exists():
        return {"setup": f"LoCoMo data not found at {data}; section skipped.", "skipped": True}
    samples = json.loads(data.read_text())
    if questions is not None:
        samples = [{**sample, "qa": sample["qa"][:questions]} for sample in samples]
    halves = select(samples, conversations)
    return asyncio.run(_score_all(embedder, samples, halves, database, neighbour))


def _empty() -> dict[str, Any]:
    return {
        "totals": {m: {lvl: {} for lvl in ("turn", "session")} for m in MODES},
        "categories": {c: {m: {"n": 0} for m in MODES} for c in CATEGORIES},
        "questions": 0,
    }


async def _score_all(
    embedder: Any,
    samples: list[dict[str, Any]],
    halves: dict[str, list[int]],
    database: str | None = None,
    neighbour: str | None = None,
) -> dict[str, Any]:
    acc = {half: _empty() for half in halves}
    dropped_ids = unresolvable = 0
    with tempfile.TemporaryDirectory() as tmp:
        store = make_store(database or Path(tmp) / "locomo.db", embedder)
        await store.start()
        try:
            for half, indexes in halves.items():
                for index in indexes:
                    d, u = await _score_conversation(
                        store, index, samples[index], acc[half], neighbour
                    )
                    dropped_ids += d
                    unresolvable += u
        finally:
            await store.close()
    result = {half: _finish(a) for half, a in acc.items()}
    held = result.get("held_out") or next(iter(result.values()))
    counts = ", ".join(f"{a['questions']} {h}" for h, a in acc.items())
    return {
        "setup": (
            f"Tuning half: conversations {halves.get('tuning')}, held-out half:"
            f" {halves.get('held_out')} (indexes in locomo10.json); every turn a memory in"
            f" its conversation's tenant; questions of categories 1-4 scored"
            f" ({counts}),"
            f" {unresolvable} without resolvable evidence skipped, {dropped_ids} malformed"
            " evidence ids dropped."
        ),
        "halves": result,
        "scores": held["scores"],
        "questions": held["questions"],
    }


async def _score_conversation(
    store: Any,
    index: int,
    sample: dict[str, Any],
    acc: dict[str, Any],
    neighbour: str | None = None,
) -> tuple[int, int]:
    tenant = f"locomo{index}"
    mapping = await load(store, tenant, sample["conversation"], neighbour)
    known = set(mapping.values())
    dropped_ids = unresolvable = 0
    for qa in sample["qa"]:
        category = qa.get("category")
        if category not in CATEGORIES:
            continue
        evidence, dropped = evidence_ids(qa.get("evidence") or [], known)
        dropped_ids += dropped
        if not evidence:
            unresolvable += 1
            continue
        acc["questions"] += 1
        for mode, options in MODES.items():
            query = RecallQuery(tenant, ["default"], qa["question"], top_k=max(KS), **options)
            ranked = [mapping[r.memory.id] for r in await store.recall(query)]
            per_category = acc["categories"][category][mode]
            per_category["n"] += 1
            for level in ("turn", "session"):
                bucket = acc["totals"][mode][level]
                for key, value in score(ranked, evidence, level).items():
                    bucket[key] = bucket.get(key, 0.0) + value
                    name = f"{level} recall_{key}"
                    if (level, f"recall_{key}") in HEADLINE:
                        per_category[name] = per_category.get(name, 0.0) + value
    return dropped_ids, unresolvable


def _finish(acc: dict[str, Any]) -> dict[str, Any]:
    n = max(acc["questions"], 1)
    scores = {
        mode: {
            lvl: {f"recall_{k}": round(v / n, 4) for k, v in vals.items()}
            for lvl, vals in levels.items()
        }
        for mode, levels in acc["totals"].items()
    }
    categories = {
        CATEGORIES[c]: {
            mode: {k: (v if k == "n" else round(v / max(vals["n"], 1), 4)) for k, v in vals.items()}
            for mode, vals in modes.items()
        }
        for c, modes in acc["categories"].items()
    }
    return {"scores": scores, "categories": categories, "questions": acc["questions"]}


def render(r: dict[str, Any], targets: dict[str, float]) -> list[str]:
    """The report's markdown: headline per half and mode, the k table, per category."""
    lines = ["## Retrieval quality on LoCoMo", "", r.get("setup", ""), ""]
    if r.get("skipped"):
        return lines
    halves = r["halves"]
    lines += ["| half | mode | questions | turn any@10 | session all@5 |", "|---|---|---|---|---|"]
    for half, res in halves.items():
        for mode, s in res["scores"].items():
            lines.append(
                f"| {half} | {mode} | {res['questions']} | {s['turn']['recall_any@10']:.3f}"
                f" | {s['session']['recall_all@5']:.3f} |"
            )
    lines.append("")
    for half, res in halves.items():
        lines += [f"Per category ({half} half), turn any@10 / session all@5:", ""]
        lines += ["| category | questions | bm25 | vector | hybrid |", "|---|---|---|---|---|"]
        for name, modes in res["categories"].items():
            cells = [
                f"{modes[m].get('turn recall_any@10', 0):.3f} /"
                f" {modes[m].get('session recall_all@5', 0):.3f}"
                for m in MODES
            ]
            lines.append(f"| {name} | {modes['hybrid']['n']} | " + " | ".join(cells) + " |")
        lines.append("")
    for half, res in halves.items():
        lines += [f"All k ({half} half), turn level then session level:", ""]
        ks = [f"{kind}@{k}" for kind in ("any", "all") for k in KS]
        for level in ("turn", "session"):
            lines += ["| " + " | ".join([level, *ks]) + " |", "|" + "---|" * (len(ks) + 1)]
            for mode, s in res["scores"].items():
                cells = [f"{s[level][f'recall_{k}']:.3f}" for k in ks]
                lines.append(f"| {mode} | " + " | ".join(cells) + " |")
            lines.append("")
    hybrid = r["scores"]["hybrid"]
    turn, sess = hybrid["turn"]["recall_any@10"], hybrid["session"]["recall_all@5"]
    t_turn, t_sess = targets["locomo_turn_any10"], targets["locomo_session_all5"]
    lines += [
        f"- held-out hybrid turn recall_any@10 = {turn:.3f} (target {t_turn}):"
        f" {'met' if turn >= t_turn else '**missed**'}",
        f"- held-out hybrid session recall_all@5 = {sess:.3f} (target {t_sess}):"
        f" {'met' if sess >= t_sess else '**missed**'}",
        "",
    ]
    return [*lines, *(f"- {note}" for note in r.get("notes", [])), ""]


def main() -> None:
    """`python -m bench.locomo [--embedder e5-small] [--neighbour text|vector]`: the
    headline table of both halves."""
    import argparse

    from memory_core.embedder import EMBEDDERS, make_embedder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", choices=EMBEDDERS, default="minilm")
    parser.add_argument(
        "--neighbour", choices=NEIGHBOURS, help="each turn's vector takes in the previous turn"
    )
    parser.add_argument("--json", type=Path, help="also write the whole result here")
    args = parser.parse_args()
    result = run(make_embedder(args.embedder), neighbour=args.neighbour)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(result["setup"])
    for half, res in result.get("halves", {}).items():
        for mode, s in res["scores"].items():
            turn, sess = s["turn"]["recall_any@10"], s["session"]["recall_all@5"]
            print(f"{half:9} {mode:7} turn any@10 {turn:.3f}  session all@5 {sess:.3f}")


if __name__ == "__main__":
    main()
