"""Content past one memory's limit is stored as several memories of one source."""

from __future__ import annotations

import httpx

from extraction.long_content import PART_CHARS, split_text
from memory_core.model import MAX_CONTENT_CHARS, normalise_content

TOPICS = ["sailing", "pottery", "chess", "beekeeping", "origami", "astronomy", "fencing"]


def long_text() -> str:
    sentences = [
        f"Note {i}: the user spent the afternoon on {TOPICS[i % len(TOPICS)]} with friends."
        for i in range(300)
    ]
    return " ".join(sentences) + " Finally the user adopted a tortoise named Zephyrine."


def test_split_text_cuts_at_sentences_and_loses_nothing():
    text = long_text()
    parts = split_text(text)
    assert len(text) > MAX_CONTENT_CHARS and len(parts) > 1
    assert all(len(p) <= PART_CHARS for p in parts)
    assert " ".join(parts) == normalise_content(text)
    assert all(p.endswith(".") for p in parts)  # sentence boundaries
    # One word longer than a part is sliced, not dropped.
    word = "x" * (PART_CHARS * 2 + 5)
    assert "".join(split_text(word)) == word


def test_admin_api_stores_long_content_as_parts_of_one_source(memory_proxy):
    server, _ = memory_proxy()
    text = long_text()
    with httpx.Client(
        base_url=server.url + "/memrelay/v1", timeout=60, headers={"X-Memrelay-Tenant": "acme"}
    ) as client:
        made = client.post("/memories", json={"content": text, "kind": "note"})
        assert made.status_code == 201, made.text
        parts = made.json()["parts"]
        assert len(parts) == len(split_text(text))
        memories = [p["memory"] for p in parts]
        assert all(m["status"] == "active" and len(m["content"]) <= PART_CHARS for m in memories)
        assert " ".join(m["content"] for m in memories) == normalise_content(text)
        sources = {m["provenance"][0]["long_source"] for m in memories}
        assert len(sources) == 1
        assert [m["provenance"][0]["part"] for m in memories] == list(range(1, len(parts) + 1))
        # The end of the text is recallable: it was not cut off or refused.
        found = client.post("/recall", json={"query": "tortoise Zephyrine", "top_k": 3}).json()
        assert found["data"][0]["memory"]["id"] == memories[-1]["id"]
        # The same long text again adds nothing.
        again = client.post("/memories", json={"content": text, "kind": "note"}).json()
        assert {p["action"] for p in again["parts"]} == {"unchanged"}
        too_long = client.post("/memories", json={"content": "word " * 50_000})
        assert too_long.status_code == 422
