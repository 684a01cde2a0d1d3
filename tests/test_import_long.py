"""Import cuts a record too long for one memory into parts of one source, as remember
does, up to the same 200,000-character cap (every backend, the CLI's and the admin
API's import both go through `import_lines`)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from memory_core import RecallQuery
from memory_core.long_text import MAX_LONG_CHARS, PART_CHARS, split_text
from memory_core.model import MAX_CONTENT_CHARS, normalise_content
from memory_core.transfer import FORMAT
from tests.test_long_content import long_text


def record(memory_id: str, content: str, **fields: Any) -> str:
    line = {
        "format": FORMAT,
        "id": memory_id,
        "status": "active",
        "space": "default",
        "kind": "note",
        "content": content,
        "subject": "diary",
        "attribute": "afternoons",
        "provenance": [{"from": "old system"}],
        "events": [{"action": "added", "actor": "user", "event_id": f"evt_{memory_id}"}],
        **fields,
    }
    return json.dumps(line)


def test_a_long_record_is_imported_as_parts_of_one_source(store, run):
    text = long_text()
    assert len(text) > MAX_CONTENT_CHARS
    expected = split_text(text)
    lines = [
        record("mem_long", text),
        record("mem_short", "The user likes green tea."),
        record("mem_huge", "word " * (MAX_LONG_CHARS // 5 + 10)),
    ]
    result = run(store.import_lines("acme", lines))
    assert result.imported == len(expected) + 1
    assert len(result.errors) == 1 and "line 3" in result.errors[0]
    assert f"{MAX_LONG_CHARS:,}" in result.errors[0]
    ids = ["mem_long", *(f"mem_long.part{n}" for n in range(2, len(expected) + 1))]
    parts = [run(store.get("acme", memory_id)) for memory_id in ids]
    assert [p.content for p in parts] == expected
    assert " ".join(p.content for p in parts) == normalise_content(text)
    assert all(len(p.content) <= PART_CHARS and p.status == "active" for p in parts)
    assert all(p.subject is None and p.attribute is None for p in parts)
    marks = [p.provenance[-1] for p in parts]
    assert len({m["long_source"] for m in marks}) == 1
    assert [m["part"] for m in marks] == list(range(1, len(parts) + 1))
    assert {m["parts"] for m in marks} == {len(parts)}
    assert all(p.provenance[0] == {"from": "old system"} for p in parts)
    # The history stays with the first part; every part says it was imported.
    assert [e.action for e in run(store.history("acme", "mem_long"))] == ["added", "imported"]
    assert [e.action for e in run(store.history("acme", ids[-1]))] == ["imported"]
    # The end of the text is recallable: nothing was cut off.
    found = run(store.recall(RecallQuery("acme", ["default"], "tortoise Zephyrine", top_k=3)))
    assert found[0].memory.id == ids[-1]
    again = run(store.import_lines("acme", lines[:2]))
    assert (again.imported, again.skipped, again.errors) == (0, len(expected) + 1, [])


def test_admin_api_import_splits_a_long_record(memory_proxy):
    server, _ = memory_proxy()
    text = long_text()
    with httpx.Client(
        base_url=server.url + "/memrelay/v1", timeout=60, headers={"X-Memrelay-Tenant": "acme"}
    ) as client:
        result = client.post("/import", content=(record("mem_long", text) + "\n").encode())
        assert result.status_code == 200, result.text
        assert result.json() == {"imported": len(split_text(text)), "skipped": 0, "errors": []}
        listed = client.get("/memories", params={"limit": 100}).json()["data"]
        assert " ".join(m["content"] for m in sorted(listed, key=_position)) == normalise_content(
            text
        )


def _position(memory: dict[str, Any]) -> int:
    return memory["provenance"][-1]["part"]
