"""Per-query fusion weights: each side weighs by how confident it is on this query."""

from __future__ import annotations

from memory_core import NewMemory, RecallQuery
from memory_core.recall import CONFIDENCE_DEPTH, confidence, side_weights

FACTS = [
    "The user's locker code is QX-7731",
    "The user enjoys hiking in the mountains on weekends",
    "The user likes walking trails near lakes",
    "The user goes trekking with friends in spring",
    "The user prefers quiet mornings with coffee",
    "The user's sister lives in Lyon",
]


def test_weights_follow_each_sides_confidence(store, run):
    filler = [NewMemory(f"Grocery list {i}: apples, bread and milk") for i in range(30)]
    run(store.add_many("acme", "default", [NewMemory(f) for f in FACTS] + filler))
    # One rare token: the text side has one sure hit, the vector side a flat crowd.
    code = run(store.recall(RecallQuery("acme", ["default"], "QX-7731")))
    assert code[0].memory.content == FACTS[0]
    # Words no memory uses: the vector side carries the whole query.
    outdoors = run(store.recall(RecallQuery("acme", ["default"], "alpine rambles outdoors")))
    assert outdoors[0].memory.content in FACTS[1:4]
    for results in (code, outdoors):
        for r in results:
            weights = r.breakdown["text_weight"] + r.breakdown["vector_weight"]
            assert abs(weights - 1) < 1e-3
    assert code[0].breakdown["text_weight"] > 0.5
    assert outdoors[0].breakdown["vector_weight"] == 1.0


def test_confidence_and_weights_edge_cases():
    assert confidence([]) == 0.0 and confidence([-1.0, -2.0]) == 0.0
    # Fewer candidates than the depth: the missing ones count as 0, full confidence.
    assert confidence([3.0, 2.0]) == 1.0
    flat = [1.0] * (CONFIDENCE_DEPTH + 1)
    assert confidence(flat) == 0.0
    # A flat side gives all the weight to a peaked one; two flat sides split by default.
    text, vector = side_weights([5.0] + [1.0] * CONFIDENCE_DEPTH, flat)
    assert (text, vector) == (1.0, 0.0)
    assert sum(side_weights(flat, flat)) == 1.0
