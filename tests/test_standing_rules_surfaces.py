"""Standing rules reach every recall surface as they reach the proxy's: the admin API's
`POST /recall`, MCP's `recall` tool and the CLI's `memrelay recall` merge them by the
same settings (MEMRELAY_RECALL_RULE_*), and `MEMRELAY_RECALL_RULE_SLOTS=0` turns them
off everywhere. Each check fails if its surface stops passing the policy."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from proxy.cli.main import app
from tests.mcp_helpers import data, http_session
from tests.test_standing_rules import FACTS, OTHER_RULES, REQUEST, RULE

# A floor a little under the rule's similarity to the request (about 0.27), so that the
# check is about the surfaces, not about where the default floor falls.
FLOOR = "0.2"


def seed_all(seed: Any, tenant: str = "acme") -> str:
    rule = seed.add(tenant, "default", RULE, kind="constraint")
    for kind, text in OTHER_RULES:
        seed.add(tenant, "default", text, kind=kind)
    for fact in FACTS:
        seed.add(tenant, "default", fact)
    return rule.id


def standing(results: list[dict[str, Any]]) -> list[str]:
    return [r["memory"]["id"] for r in results if r["breakdown"].get("standing_slot")]


@pytest.mark.parametrize("slots", [3, 0])
def test_admin_api_and_mcp_recall_merge_standing_rules(memory_proxy, slots: int) -> None:
    server, seed = memory_proxy(recall_rule_slots=slots, recall_rule_min_similarity=float(FLOOR))
    rule_id = seed_all(seed)
    headers = {"X-Memrelay-Tenant": "acme"}
    admin = httpx.post(
        server.url + "/memrelay/v1/recall",
        json={"query": REQUEST, "top_k": 3},
        headers=headers,
        timeout=30,
    ).json()["data"]

    async def tool() -> list[dict[str, Any]]:
        async with http_session(server.url, headers) as session:
            result = await session.call_tool("recall", {"query": REQUEST, "top_k": 3})
            return data(result)["data"]

    mcp = asyncio.run(tool())
    expected = [rule_id] if slots else []
    assert standing(admin) == expected
    assert standing(mcp) == expected
    assert len(admin) == len(mcp) == 3
    # Narrowed by kinds, a recall gets only what it asked for.
    facts_only = httpx.post(
        server.url + "/memrelay/v1/recall",
        json={"query": REQUEST, "top_k": 3, "kinds": ["fact"]},
        headers=headers,
        timeout=30,
    ).json()["data"]
    assert {r["memory"]["kind"] for r in facts_only} == {"fact"}


@pytest.mark.parametrize("slots", ["3", "0"])
def test_cli_recall_merges_standing_rules(
    tmp_path: Any, embedder: Any, monkeypatch: Any, slots: str
) -> None:
    from tests.conftest import SeedStore

    db = tmp_path / "cli.db"
    seed = SeedStore(db, embedder)
    try:
        rule_id = seed_all(seed)
    finally:
        seed.close()
    monkeypatch.setenv("MEMRELAY_RECALL_RULE_SLOTS", slots)
    monkeypatch.setenv("MEMRELAY_RECALL_RULE_MIN_SIMILARITY", FLOOR)
    result = CliRunner().invoke(
        app,
        ["recall", REQUEST, "--db", str(db), "--tenant", "acme", "--top-k", "3", "--json"],
    )
    assert result.exit_code == 0, result.output
    assert standing(json.loads(result.output)) == ([rule_id] if slots != "0" else [])
