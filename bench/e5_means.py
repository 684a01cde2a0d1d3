"""The mean e5-small vectors that E5Embedder subtracts (memory_core/e5_means.npy).

e5's vectors share a large common direction: any two texts score 0.7-0.9 cosine, so
every similarity threshold in memrelay (tuned for MiniLM, where unrelated texts score
near 0.2) would pass nearly everything. Subtracting the mean passage vector from
passages and the mean query vector from queries, then renormalising, brings unrelated
texts back near 0.2 and close ones to 0.4-0.6. The means come from the project's own
texts (the chat turns and facts of tests/scenarios.py and the README's sentences), not
from any benchmark (the shipped file: 176 texts on 2026-12-01; the README has grown
since, which moves the means by less than 1e-4 in cosine). `python -m bench.e5_means`
shows how far today's texts' means are from the shipped ones; `--write` replaces the
file, and then
E5_SMALL_NAME must change too (databases built with the old means would otherwise get
query vectors centred differently from their stored ones).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def corpus() -> list[str]:
    """The scenario turns and facts, then the README's prose sentences."""
    import tests.scenarios as scenarios

    texts: set[str] = set()

    def walk(node: Any, depth: int = 0) -> None:
        if depth > 6:
            return
        if isinstance(node, scenarios.Turn):
            texts.update([node.user, node.reply, *(f.content for f in node.facts)])
        elif dataclasses.is_dataclass(node) and not isinstance(node, type):
            for f in dataclasses.fields(node):
                walk(getattr(node, f.name), depth + 1)
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item, depth + 1)
        elif isinstance(node, dict):
            for item in node.values():
                walk(item, depth + 1)

    for name in dir(scenarios):
        walk(getattr(scenarios, name))
    turns = sorted(t for t in texts if t and len(t) > 8 and t != "Noted.")
    readme = (ROOT / "README.md").read_text()
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", readme)]
    prose = [p for p in paragraphs if 40 < len(p) < 600 and not p.startswith(("|", "```", "#"))]
    sentences = [s for p in prose for s in re.split(r"(?<=[.!?])\s+", p) if 30 < len(s) < 300]
    return turns + sentences


def main() -> None:
    import sys

    from memory_core.e5_embedder import MEANS_FILE, E5Embedder

    texts = corpus()
    model = E5Embedder(centred=False)
    means = np.stack([model.embed(texts).mean(0), model.embed_queries(texts).mean(0)])
    shipped = np.load(MEANS_FILE)
    cosines = (means * shipped).sum(1) / np.linalg.norm(means, axis=1)
    cosines /= np.linalg.norm(shipped, axis=1)
    print(f"{len(texts)} texts; cosine to the shipped means: {cosines.round(4).tolist()}")
    if "--write" in sys.argv:
        np.save(MEANS_FILE, means.astype(np.float32))
        print(f"written to {MEANS_FILE}: change E5_SMALL_NAME")


if __name__ == "__main__":
    main()
