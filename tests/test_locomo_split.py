"""The LoCoMo benchmark's split: fixed, disjoint halves, both reported.

Runs bench/locomo.py on a small LoCoMo-shaped file (made up here, not the real data)
with a real SQLite store and the real embedding model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import locomo
from bench.report import TARGETS


def test_halves_are_fixed_disjoint_and_cover_the_ten_conversations() -> None:
    assert locomo.TUNING == (0, 1, 2, 3, 4)
    assert locomo.HELD_OUT == (5, 6, 7, 8, 9)
    assert not set(locomo.TUNING) & set(locomo.HELD_OUT)
    # The earlier fusion tuning used conversations 0-2: none of them is held out.
    assert {0, 1, 2} <= set(locomo.TUNING)


def _conversation(topic: str, index: int) -> dict[str, Any]:
    turns = [
        {"speaker": "Ann", "dia_id": "D1:1", "text": f"I adopted a {topic} called Pip {index}."},
        {"speaker": "Bob", "dia_id": "D1:2", "text": "The weather was grey all week."},
        {"speaker": "Ann", "dia_id": "D1:3", "text": "My brother moved to Oslo last spring."},
    ]
    qa = [
        {"question": f"What is the name of Ann's {topic}?", "evidence": ["D1:1"], "category": 4},
        {"question": "Where did Ann's brother move?", "evidence": ["D1:3"], "category": 1},
        {"question": "Nothing here", "evidence": [], "category": 4},
        {"question": "Adversarial", "evidence": ["D1:2"], "category": 5},
    ]
    return {
        "conversation": {"session_1": turns, "session_1_date_time": "1 May 2023"},
        "qa": qa,
    }


def test_both_halves_are_scored_and_reported(tmp_path: Path, embedder: Any) -> None:
    topics = ["cat", "dog", "parrot", "horse", "rabbit", "turtle", "goat", "hamster", "fox", "owl"]
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps([_conversation(t, i) for i, t in enumerate(topics)]))

    result = locomo.run(embedder, conversations=2, data=data)

    halves = result["halves"]
    assert set(halves) == {"tuning", "held_out"}
    assert "[0, 1]" in result["setup"] and "[5, 6]" in result["setup"]
    for half in halves.values():
        # two conversations per half, two scorable questions each (no evidence and
        # category 5 are skipped)
        assert half["questions"] == 4
        assert set(half["scores"]) == {"bm25", "vector", "hybrid"}
        assert half["categories"]["single-hop"]["hybrid"]["n"] == 2
        assert half["categories"]["multi-hop"]["hybrid"]["n"] == 2
        # three turns per tenant: the evidence is always in the top 10
        assert half["scores"]["hybrid"]["turn"]["recall_any@10"] == 1.0
    assert result["scores"] == halves["held_out"]["scores"]
    text = "\n".join(locomo.render(result, TARGETS))
    assert "| held_out | hybrid | 4 |" in text and "| tuning | bm25 | 4 |" in text
    assert "| single-hop | 2 |" in text
