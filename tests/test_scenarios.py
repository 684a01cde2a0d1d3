"""The scenario suite: multi-turn conversations through memrelay (openai SDK as client)
against a scripted perfect model, on SQLite and on Postgres. Each scenario must end
with the right facts in the system message the upstream receives, and no stale ones.

One memrelay per backend serves every scenario (one tenant each), sharing the embedder.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from memory_core import SQLiteStore
from memory_core.postgres.store import PostgresStore
from proxy.settings import Settings
from proxy.wiring import build_app
from tests.perfect_model import PerfectModel
from tests.scenario_runner import play
from tests.scenarios import SCENARIOS
from tests.servers import ServedApp


def scenario_settings(db: Any, upstream: str, **overrides: Any) -> Settings:
    """Every active memory of a small tenant is a recall candidate, so what is injected
    is what memrelay holds true: stale facts cannot hide behind a low score."""
    values: dict[str, Any] = {
        "db": db,
        "upstream_url": upstream,
        "extraction_workers": 1,
        "extraction_retry_base_seconds": 0.05,
        "extraction_max_attempts": 2,
        "recall_min_similarity": -1.0,
        "recall_top_k": 20,
        "recall_budget_ms": 5000,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def memrelay(request, served_fake, embedder, tmp_path_factory) -> Iterator[tuple[str, Any]]:
    _fake, served = served_fake
    if request.param == "postgres":
        db: Any = request.getfixturevalue("pg_server").new_database("scenarios")
        store: Any = PostgresStore(db, embedder)
    else:
        db = tmp_path_factory.mktemp("scenarios") / "memory.db"
        store = SQLiteStore(db, embedder)
    with ServedApp(build_app(scenario_settings(db, served.url), store=store)) as server:
        yield server.url, request.param


@pytest.fixture
def perfect(served_fake) -> Iterator[PerfectModel]:
    fake, _ = served_fake
    fake.reset()
    fake.responder = model = PerfectModel()
    yield model
    fake.reset()


def test_there_are_at_least_25_scenarios_with_unique_turns():
    from tests.scenarios import by_user_text

    assert len(SCENARIOS) >= 25
    assert by_user_text()


@pytest.mark.parametrize("index", range(len(SCENARIOS)), ids=[s.name for s in SCENARIOS])
def test_scenario(index, memrelay, perfect):
    url, backend = memrelay
    scenario = SCENARIOS[index]
    tenant = f"{backend}-{index}-{re.sub(r'[^a-z0-9]+', '-', scenario.name)[:40]}"
    result = play(url, perfect, scenario, tenant)
    assert result.ok, f"{result.problems}\nsystem message:\n{result.system}"
