"""What `X-Memrelay-Memory-Status` says is what happened: `queued` only with a job
written, `skipped` when it cannot be, `shed` past the backlog limits, `duplicate` for a
request already learned; an answer that fails leaves no job behind; readyz and metrics
show the learning loop."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from memory_core.sqlite.db import connect
from tests.fake_upstream import Reply, chat_chunk
from tests.test_metrics import scrape, value


def say(server, text, tenant="acme"):
    client = openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="sk-user",
        max_retries=0,
        default_headers={"X-Memrelay-Tenant": tenant},
    )
    response = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}]
    )
    return response.headers["x-memrelay-memory-status"]


def job_rows(db) -> list[tuple]:
    """Every row of the jobs table, drafts included, read from the file."""
    conn = connect(db)
    try:
        return conn.execute("SELECT id, tenant, status FROM jobs").fetchall()
    finally:
        conn.close()


def test_a_job_that_cannot_be_written_never_says_queued(fake, memory_proxy, tmp_path, caplog):
    """The database refuses the write (as a full disk would): the answer still comes,
    and says `skipped`, not `queued`."""
    db = tmp_path / "full.db"
    server, _seed = memory_proxy(db=db)
    conn = connect(db)
    conn.execute(
        "CREATE TRIGGER disk_full BEFORE INSERT ON jobs"
        " BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
    )
    try:
        assert [say(server, f"I like tea, take {n}") for n in range(3)] == ["skipped"] * 3
        assert job_rows(db) == []
        assert any("disk is full" in r.getMessage() for r in caplog.records)
    finally:
        conn.execute("DROP TRIGGER disk_full")
        conn.close()
    assert say(server, "I like tea, once more") == "queued"
    assert len(job_rows(db)) == 1


def test_past_the_backlog_limits_exchanges_are_shed(fake, memory_proxy, tmp_path):
    db = tmp_path / "busy.db"
    server, _seed = memory_proxy(
        db=db, extraction_max_backlog_per_tenant=2, extraction_max_backlog=3
    )
    assert [say(server, f"fact {n}") for n in range(3)] == ["queued", "queued", "shed"]
    assert [say(server, f"fact {n}", tenant="other") for n in range(2)] == ["queued", "shed"]
    assert len(job_rows(db)) == 3
    metrics = scrape(server)
    assert value(metrics, "memrelay_learning_exchanges_total", status="shed") == 2
    assert value(metrics, "memrelay_learning_exchanges_total", status="queued") == 3


def test_the_same_request_twice_is_learned_once(fake, memory_proxy, tmp_path):
    db = tmp_path / "dup.db"
    server, _seed = memory_proxy(db=db)
    assert say(server, "My locker is L42") == "queued"
    assert say(server, "My locker is L42") == "duplicate"
    assert say(server, "My locker is L42", tenant="other") == "queued"  # another scope
    assert say(server, "My locker is now L43") == "queued"
    assert sorted(t for _id, t, _s in job_rows(db)) == ["acme", "acme", "other"]


def test_the_dedup_window_can_be_closed(fake, memory_proxy, tmp_path):
    server, _seed = memory_proxy(db=tmp_path / "nodup.db", extraction_dedup_seconds=0)
    assert [say(server, "Same words") for _ in range(2)] == ["queued", "queued"]


def test_an_answer_that_fails_leaves_no_job(fake, memory_proxy, tmp_path):
    """The draft written before the headers is dropped when the answer does not end."""
    db = tmp_path / "drop.db"
    server, _seed = memory_proxy(db=db)
    fake.script.append(Reply.json({"error": {"message": "nope"}}, status=500))
    with pytest.raises(openai.InternalServerError) as info:
        say(server, "this fails upstream")
    assert info.value.response.headers["x-memrelay-memory-status"] == "skipped"
    fake.script.append(Reply.cut([chat_chunk({"role": "assistant", "content": "half"})]))
    with (
        pytest.raises(httpx.HTTPError),
        httpx.stream(
            "POST",
            server.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "cut"}], "stream": True},
        ) as response,
    ):
        response.read()
    deadline = time.monotonic() + 10
    while job_rows(db) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job_rows(db) == []
    metrics = scrape(server)
    assert value(metrics, "memrelay_learning_drafts_total", outcome="dropped") == 2


def test_readyz_reports_the_learning_loop(fake, memory_proxy, tmp_path):
    server, _seed = memory_proxy(db=tmp_path / "ready.db", extraction_workers=2)
    ready = httpx.get(server.url + "/memrelay/readyz").json()
    learning = ready["learning"]
    assert ready["status"] == "ready"
    assert learning["workers"] == 2 and learning["workers_alive"] == 2
    assert learning["backlog"] == 0 and learning["oldest_pending_seconds"] == 0


def test_an_operator_purges_a_dead_job(tmp_path, embedder, monkeypatch):
    from tests.test_cli import as_json, cli

    db = tmp_path / "cli.db"
    monkeypatch.setenv("MEMRELAY_DB", str(db))
    as_json("stats")  # creates the database
    conn = connect(db)
    conn.execute(
        "INSERT INTO jobs (id, tenant, space, status, payload, attempts, max_attempts,"
        " available_at, last_error, created_at, updated_at) VALUES"
        " ('job_dead', 'default', 'default', 'dead', '{}', 3, 3, 0, 'boom', 0, 0),"
        " ('job_wait', 'default', 'default', 'pending', '{}', 0, 3, 0, NULL, 0, 0)"
    )
    conn.close()
    assert as_json("jobs", "--purge", "job_dead") == {"id": "job_dead", "purged": True}
    assert "only dead" in cli("jobs", "--purge", "job_wait", code=2)
    assert [j["id"] for j in as_json("jobs")["data"]] == ["job_wait"]
