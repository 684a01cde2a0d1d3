"""Every CLI command on a real database file, success and failure, text and --json."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memory_core.sqlite.db import connect
from proxy.cli.main import app

runner = CliRunner()


@pytest.fixture
def db(tmp_path, embedder, monkeypatch):
    path = tmp_path / "cli.db"
    monkeypatch.setenv("MEMRELAY_DB", str(path))
    return path


def cli(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert result.exit_code == code, result.output
    return result.output


def as_json(*args: str, code: int = 0):
    return json.loads(cli(*args, "--json", code=code))


def test_remember_recall_list_inspect_history_events_stats(db):
    first = as_json(
        "remember",
        "The user lives in Oslo",
        "--subject",
        "user",
        "--attribute",
        "city",
        "--value",
        "Oslo",
        "--tenant",
        "acme",
    )
    assert first["action"] == "added" and first["memory"]["source"] == "admin"
    second = as_json(
        "remember",
        "The user lives in Bergen",
        "--subject",
        "user",
        "--attribute",
        "city",
        "--value",
        "Bergen",
        "--tenant",
        "acme",
    )
    assert second["action"] == "superseded" and second["old_ids"] == [first["memory_id"]]
    assert "superseded" in cli(
        "remember",
        "The user lives in Tromso",
        "--subject",
        "user",
        "--attribute",
        "city",
        "--value",
        "Tromso",
        "--tenant",
        "acme",
    )
    results = as_json("recall", "which city", "--tenant", "acme")
    assert [r["memory"]["content"] for r in results] == ["The user lives in Tromso"]
    assert "Tromso" in cli("recall", "which city", "--tenant", "acme")
    listed = as_json("list", "--tenant", "acme")
    assert [m["content"] for m in listed["data"]] == ["The user lives in Tromso"]
    everything = as_json("list", "--tenant", "acme", "--status", "superseded")
    assert len(everything["data"]) == 2
    ledger = as_json("inspect", "--tenant", "acme")
    assert [m["status"] for m in ledger] == ["superseded", "superseded", "active"]
    assert ledger[0]["superseded_by"] == ledger[1]["id"] and ledger[0]["status_reason"]
    assert "same slot" in cli("inspect", "--tenant", "acme")
    history = as_json("history", first["memory_id"], "--tenant", "acme")
    assert [e["action"] for e in history] == ["added", "superseded"]
    events = as_json("events", "--tenant", "acme", "--since", "0")
    assert len(events) >= 5
    stats = as_json("stats", "--tenant", "acme")
    assert stats["by_status"] == {"active": 1, "superseded": 2}
    assert "total 3" in cli("stats", "--tenant", "acme")


def test_failures_are_readable(db):
    assert "no memory" in cli("forget", "mem_nope", code=2)
    assert "kind" in cli("remember", "x", "--kind", "opinion", code=2)
    assert "tenant id" in cli("list", "--tenant", "bad tenant", code=2)
    assert "no history" in cli("history", "mem_nope", code=1)
    assert "no such file" in cli("import", "/nonexistent.jsonl", code=2)


def test_forget_export_import(db, tmp_path):
    kept = as_json("remember", "Keep this note")["memory_id"]
    gone = as_json("remember", "Forget this note")["memory_id"]
    assert as_json("forget", gone, "--reason", "test")["status"] == "forgotten"
    out = tmp_path / "dump.jsonl"
    assert as_json("export", str(out)) == {"exported": 2, "file": str(out)}
    assert len(out.read_text().splitlines()) == 2
    other = tmp_path / "other.db"
    result = as_json("import", str(out), "--db", str(other))
    assert result == {"imported": 2, "skipped": 0, "errors": []}
    assert as_json("import", str(out), "--db", str(other))["skipped"] == 2
    assert [m["id"] for m in as_json("list", "--db", str(other))["data"]] == [kept]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    assert "errors 1" in cli("import", str(bad), "--db", str(other), code=1)


def test_jobs_and_retry(db):
    as_json("stats")  # creates the database
    conn = connect(db)
    conn.execute(
        "INSERT INTO jobs (id, tenant, space, status, payload, attempts, max_attempts,"
        " available_at, last_error, created_at, updated_at) VALUES"
        " ('job_1', 'default', 'default', 'dead', '{}', 3, 3, 0, 'boom', 0, 0)"
    )
    conn.close()
    listed = as_json("jobs", "--status", "dead")
    assert [j["id"] for j in listed["data"]] == ["job_1"] and listed["counts"]["dead"] == 1
    assert as_json("jobs", "--retry", "job_1")["status"] == "pending"
    assert "only dead" in cli("jobs", "--retry", "job_1", code=2)


def test_lint_passes_then_catches_broken_state(db):
    as_json("remember", "A healthy memory")
    as_json("remember", "Another healthy memory")
    assert "ok" in cli("lint")
    assert as_json("lint") == []
    conn = connect(db)
    conn.execute("DELETE FROM memory_vec WHERE rowid = (SELECT min(rowid) FROM memories)")
    conn.execute("DELETE FROM text_docs WHERE doc = (SELECT min(rowid) FROM memories)")
    conn.execute(
        "UPDATE memories SET status = 'forgotten' WHERE rowid = (SELECT max(rowid) FROM memories)"
    )
    conn.execute(
        "INSERT INTO events (event_id, memory_id, tenant, space, action, actor, at)"
        " VALUES ('e1', 'mem_ghost', 'default', 'default', 'added', 'x', 0)"
    )
    conn.close()
    findings = {f["check"] for f in as_json("lint", code=1)}
    assert findings >= {
        "active_without_vector",
        "forgotten_with_content",
        "text_without_active_memory",
        "vector_without_active_memory",
        "event_without_memory",
        "active_without_postings",
        "postings_without_active_memory",
    }


def test_keys_create_list_revoke(tmp_path):
    keys = str(tmp_path / "keys.json")
    created = as_json("keys", "create", "--keys-file", keys, "--tenant", "acme", "--name", "app")
    assert created["key"].startswith("mr_") and created["tenants"] == ["acme"]
    assert created["key"] not in (tmp_path / "keys.json").read_text()
    listed = as_json("keys", "list", "--keys-file", keys)
    assert [k["id"] for k in listed] == [created["id"]] and "key" not in listed[0]
    assert as_json("keys", "revoke", created["id"], "--keys-file", keys)["revoked"] is True
    assert "no key" in cli("keys", "revoke", "key_nope", "--keys-file", keys, code=2)
    assert "--tenant" in cli("keys", "create", "--keys-file", keys, code=2)


def test_serve_refuses_to_run_open_off_loopback(tmp_path):
    output = cli("serve", "--upstream", "http://127.0.0.1:9", "--host", "0.0.0.0", code=2)
    assert "without keys" in output
    assert "no GGUF" in cli("serve", "--model", "/nonexistent.gguf", code=2)
    assert "must start with http" in cli("serve", "--upstream", "ftp://x", code=2)


def test_the_same_commands_work_on_postgres(pg_server, embedder, tmp_path, monkeypatch):
    url = pg_server.new_database("cli")
    monkeypatch.setenv("MEMRELAY_DB", url)
    migrated = as_json("migrate")
    assert migrated["schema_version"] >= 1 and migrated["database"].startswith("postgresql:")
    added = as_json(
        "remember", "Never deploy on Fridays", "--kind", "constraint", "--tenant", "acme"
    )
    memory_id = added["memory"]["id"]
    hits = as_json("recall", "can I deploy today?", "--tenant", "acme")
    assert [h["memory"]["id"] for h in hits] == [memory_id]
    assert "text_bm25" in hits[0]["breakdown"]
    assert as_json("stats", "--tenant", "acme")["by_status"] == {"active": 1}
    assert as_json("lint") == []
    out = tmp_path / "acme.jsonl"
    cli("export", str(out), "--tenant", "acme")
    other = pg_server.new_database("cli")
    assert as_json("import", str(out), "--tenant", "acme", "--db", other)["imported"] == 1
    as_json("forget", memory_id, "--reason", "asked", "--tenant", "acme")
    assert as_json("recall", "deploy Fridays", "--tenant", "acme") == []
    assert "cannot open postgresql:" in cli(
        "stats", "--db", "postgresql://nobody@127.0.0.1:1/none", code=2
    )
