"""Retrieval quality on LoCoMo: BM25-only, vector-only and memrelay's hybrid recall.

Run: .venv/bin/python bench/locomo_bench.py [--data ../shared/bench-data/locomo10.json]

Every turn of each of the 10 conversations is stored as a memory in its own tenant
("Speaker: text", with the session date); each question of categories 1-4 with evidence
is recalled and scored: recall_any@k (some evidence turn in the top k) and recall_all@k
(all of them), at turn level (evidence ids like D1:3) and session level (D1). The data
is CC BY-NC 4.0 and is read from where the team keeps it, never copied here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from memory_core import FastEmbedEmbedder, NewMemory, RecallQuery, SQLiteStore

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "bench-data" / "locomo10.json"
KS = (1, 5, 10, 20)
MODES = {"bm25": {"use_vector": False}, "vector": {"use_text": False}, "hybrid": {}}
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


async def load(store: SQLiteStore, tenant: str, conversation: dict[str, Any]) -> dict[str, str]:
    """Store every turn; returns memory id -> dia id."""
    items, dia = [], []
    n = 1
    while f"session_{n}" in conversation:
        when = conversation.get(f"session_{n}_date_time", "")
        for turn in conversation[f"session_{n}"]:
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares a photo of {turn['blip_caption']}]"
            items.append(NewMemory(f"{text} ({when})", kind="note", source="import"))
            dia.append(turn["dia_id"])
        n += 1
    mapping: dict[str, str] = {}
    for start in range(0, len(items), 256):
        memories = await store.add_many(tenant, "default", items[start : start + 256])
        mapping.update({m.id: dia[start + i] for i, m in enumerate(memories)})
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversations", type=int, default=10)
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    samples = json.loads(args.data.read_text())[: args.conversations]
    embedder = FastEmbedEmbedder()
    totals: dict[str, dict[str, dict[str, float]]] = {
        m: {lvl: {} for lvl in ("turn", "session")} for m in MODES
    }
    questions = dropped_ids = unresolvable = 0
    with tempfile.TemporaryDirectory() as tmp:
        store = await SQLiteStore.open(Path(tmp) / "locomo.db", embedder)
        try:
            for index, sample in enumerate(samples):
                tenant = f"locomo{index}"
                mapping = await load(store, tenant, sample["conversation"])
                known = set(mapping.values())
                for qa in sample["qa"]:
                    if qa.get("category") not in (1, 2, 3, 4):
                        continue
                    evidence, dropped = evidence_ids(qa.get("evidence") or [], known)
                    dropped_ids += dropped
                    if not evidence:
                        unresolvable += 1
                        continue
                    questions += 1
                    for mode, options in MODES.items():
                        results = await store.recall(
                            RecallQuery(
                                tenant, ["default"], qa["question"], top_k=max(KS), **options
                            )
                        )
                        ranked = [mapping[r.memory.id] for r in results]
                        for level in ("turn", "session"):
                            bucket = totals[mode][level]
                            for key, value in score(ranked, evidence, level).items():
                                bucket[key] = bucket.get(key, 0.0) + value
        finally:
            await store.close()
    report = {
        mode: {lvl: {k: v / questions for k, v in vals.items()} for lvl, vals in levels.items()}
        for mode, levels in totals.items()
    }
    print(
        f"{questions} questions scored; {unresolvable} without resolvable evidence skipped;"
        f" {dropped_ids} malformed or unknown evidence ids dropped"
    )
    for level in ("turn", "session"):
        print(f"\n{level} level")
        header = " ".join(f"{f'{m}@{k}':>9}" for m in ("any", "all") for k in KS)
        print(f"{'mode':<8} {header}")
        for mode in MODES:
            row = report[mode][level]
            print(
                f"{mode:<8} "
                + " ".join(f"{row[f'{m}@{k}']:>9.3f}" for m in ("any", "all") for k in KS)
            )
    if args.json:
        args.json.write_text(json.dumps({"questions": questions, "results": report}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
