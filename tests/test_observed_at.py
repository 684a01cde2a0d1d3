"""`observed_at`: when a thing was said, through the store, the admin API, import and
extraction, and used by recall so the latest version of a fact ranks first."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from memory_core import InvalidInput, NewMemory, RecallQuery, SQLiteStore
from memory_core.sqlite import schema
from memory_core.sqlite.db import connect
from tests.extraction_script import fact
from tests.test_extraction_pipeline import active, drain, say

JAN = 1_672_531_200.0  # 2023-01-01
JUN = 1_685_577_600.0  # 2023-06-01


def test_store_keeps_observed_at_and_refuses_bad_values(store, run):
    memory = run(store.add("acme", "default", NewMemory("Ann lives in Oslo", observed_at=JAN)))
    assert memory.observed_at == JAN
    assert run(store.get("acme", memory.id)).observed_at == JAN
    plain = run(store.add("acme", "default", NewMemory("Ann has a cat")))
    assert run(store.get("acme", plain.id)).observed_at is None
    for bad in (float("nan"), float("inf"), -1.0, "yesterday", True):
        with pytest.raises(InvalidInput, match="observed_at"):
            run(store.add("acme", "default", NewMemory("Ann has a dog", observed_at=bad)))


def test_latest_version_of_a_slot_ranks_first(store, run):
    # The older statement matches the query's words better; the newer one was said later.
    old = NewMemory(
        "Ann's favourite city to live in is Oslo, Ann lives in Oslo",
        subject="ann",
        attribute="home_city",
        value="Oslo",
        observed_at=JAN,
    )
    new = NewMemory(
        "Ann moved to Bergen",
        subject="ann",
        attribute="home_city",
        value="Bergen",
        observed_at=JUN,
    )
    added = run(store.add_many("acme", "default", [old, new]))
    results = run(store.recall(RecallQuery("acme", ["default"], "Which city does Ann live in?")))
    ids = [r.memory.id for r in results]
    assert ids.index(added[1].id) < ids.index(added[0].id)
    assert results[0].breakdown["version_rank"] == 1
    # Same texts, order of saying reversed: the other one is first.
    swapped = [
        NewMemory(old.content, subject="ann", attribute="home_city", observed_at=JUN),
        NewMemory(new.content, subject="ann", attribute="home_city", observed_at=JAN),
    ]
    again = run(store.add_many("other", "default", swapped))
    results = run(store.recall(RecallQuery("other", ["default"], "Which city does Ann live in?")))
    assert results[0].memory.id == again[0].id


def test_export_and_import_keep_observed_at(tmp_path: Path, embedder: Any) -> None:
    import asyncio

    async def scenario() -> None:
        source = await SQLiteStore.open(tmp_path / "a.db", embedder)
        target = await SQLiteStore.open(tmp_path / "b.db", embedder)
        try:
            await source.add("acme", "default", NewMemory("Ann lives in Oslo", observed_at=JAN))
            lines = [line async for line in source.export("acme")]
            assert '"observed_at": ' + str(JAN) in lines[0]
            result = await target.import_lines("acme", lines)
            assert result.imported == 1
            (memory,) = (await target.list(_list("acme"))).items
            assert memory.observed_at == JAN
        finally:
            await source.close()
            await target.close()

    asyncio.run(scenario())


def _list(tenant: str) -> Any:
    from memory_core import ListQuery

    return ListQuery(tenant, limit=10)


def test_a_version_3_database_gains_the_column(tmp_path: Path, embedder: Any) -> None:
    import asyncio

    path = tmp_path / "old.db"
    conn = connect(path)
    saved = schema.MIGRATIONS
    schema.MIGRATIONS = saved[:3]
    try:
        assert schema.migrate(conn, embedder.name, embedder.dim) == 3
    finally:
        schema.MIGRATIONS = saved
    conn.close()

    async def scenario() -> None:
        store = await SQLiteStore.open(path, embedder)
        try:
            memory = await store.add("acme", "default", NewMemory("Hi", observed_at=JUN))
            assert (await store.get("acme", memory.id)).observed_at == JUN
        finally:
            await store.close()

    asyncio.run(scenario())


def test_admin_api_sets_observed_at(memory_proxy):
    server, _ = memory_proxy()
    with httpx.Client(
        base_url=server.url + "/memrelay/v1", timeout=30, headers={"X-Memrelay-Tenant": "acme"}
    ) as client:
        made = client.post("/memories", json={"content": "Ann lives in Oslo", "observed_at": JAN})
        assert made.status_code == 201, made.text
        assert made.json()["memory"]["observed_at"] == JAN
        got = client.get(f"/memories/{made.json()['memory']['id']}").json()
        assert got["observed_at"] == JAN
        bad = client.post("/memories", json={"content": "Ann has a cat", "observed_at": -5})
        assert bad.status_code == 422


def test_extraction_fills_observed_at_from_the_exchange_time(fake, memory_proxy, script):
    server, seed = memory_proxy(extraction_workers=1)
    script.facts["tea"] = [fact("The user drinks green tea every morning", "preference")]
    before = time.time()
    say(server, "I love my tea")
    after = time.time()
    drain(seed, 1)
    (memory,) = active(seed)
    assert memory.observed_at is not None and before - 1 <= memory.observed_at <= after + 1


@pytest.fixture
def script(fake):
    from tests.extraction_script import ScriptedExtraction

    scripted = ScriptedExtraction()
    fake.responder = scripted
    return scripted


def test_a_version_2_postgres_database_gains_the_column(pg_server: Any, embedder: Any) -> None:
    import asyncio

    from psycopg import AsyncConnection

    from memory_core.postgres import schema as pg_schema
    from memory_core.postgres.store import PostgresStore

    url = pg_server.new_database()

    async def scenario() -> None:
        saved = pg_schema.MIGRATIONS
        pg_schema.MIGRATIONS = saved[:2]
        try:
            async with await AsyncConnection.connect(url) as conn:
                assert await pg_schema.migrate(conn, embedder.name, embedder.dim) == 2
        finally:
            pg_schema.MIGRATIONS = saved
        store = await PostgresStore.open(url, embedder)
        try:
            memory = await store.add("acme", "default", NewMemory("Hi", observed_at=JUN))
            assert (await store.get("acme", memory.id)).observed_at == JUN
        finally:
            await store.close()

    asyncio.run(scenario())
