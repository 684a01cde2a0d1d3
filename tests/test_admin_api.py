"""The admin REST API, every route, success and failure, against a served memrelay."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.text_checks import without_generated_ids


@pytest.fixture
def admin(memory_proxy):
    server, seed = memory_proxy()
    client = httpx.Client(
        base_url=server.url + "/memrelay/v1", timeout=30, headers={"X-Memrelay-Tenant": "acme"}
    )
    yield client, seed
    client.close()


def test_remember_reconciles_and_reports(admin):
    client, _ = admin
    first = client.post(
        "/memories",
        json={
            "content": "The user prefers tea",
            "kind": "preference",
            "subject": "user",
            "attribute": "drink",
            "value": "tea",
        },
    )
    assert first.status_code == 201 and first.json()["action"] == "added"
    memory = first.json()["memory"]
    assert (
        memory["status"] == "active"
        and memory["source"] == "admin"
        and memory["id"].startswith("mem_")
    )
    same = client.post("/memories", json={"content": "The user prefers tea", "kind": "preference"})
    assert same.status_code == 200 and same.json()["action"] == "reinforced"
    changed = client.post(
        "/memories",
        json={
            "content": "The user prefers coffee",
            "kind": "preference",
            "subject": "user",
            "attribute": "drink",
            "value": "coffee",
        },
    )
    assert changed.status_code == 201
    assert changed.json()["action"] == "superseded" and changed.json()["superseded"] == [
        memory["id"]
    ]
    old = client.get(f"/memories/{memory['id']}").json()
    assert old["status"] == "superseded" and old["superseded_by"] == changed.json()["memory"]["id"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"content": "x", "unknown": 1}, 422),
        ({"content": 5}, 422),
        ({"content": ""}, 422),
        ({"content": "x", "kind": "opinion"}, 422),
        ({"content": "x", "confidence": 2}, 422),
        ({}, 422),
    ],
)
def test_remember_validation(admin, body, status):
    client, _ = admin
    response = client.post("/memories", json=body)
    assert response.status_code == status
    assert response.json()["error"]["details"]


def test_malformed_json_and_headers(admin):
    client, _ = admin
    assert client.post("/memories", content=b"{oops").status_code == 400
    bad = client.get("/memories", headers={"X-Memrelay-Tenant": "no spaces allowed"})
    assert bad.status_code == 400 and "X-Memrelay-Tenant" in bad.json()["error"]["message"]


def test_list_filters_paging_and_get(admin):
    client, seed = admin
    for i in range(7):
        seed.add("acme", "work" if i % 2 else "home", f"Fact {i}", kind="goal" if i < 3 else "fact")
    seed.add("other", "work", "Not yours")
    page = client.get("/memories", params={"limit": 3})
    assert page.status_code == 200 and len(page.json()["data"]) == 3
    seen = [m["id"] for m in page.json()["data"]]
    while page.json()["next_cursor"]:
        page = client.get("/memories", params={"limit": 3, "cursor": page.json()["next_cursor"]})
        seen += [m["id"] for m in page.json()["data"]]
    assert len(set(seen)) == 7
    goals = client.get("/memories", params={"kind": "goal"}).json()["data"]
    assert len(goals) == 3
    work = client.get("/memories", params={"space": "work"}).json()["data"]
    assert {m["space"] for m in work} == {"work"}
    assert client.get("/memories", params={"limit": "many"}).status_code == 422
    assert client.get("/memories", params={"status": "deleted"}).status_code == 422
    assert client.get("/memories", params={"cursor": "zzz"}).status_code == 400
    one = client.get(f"/memories/{seen[0]}")
    assert one.status_code == 200 and one.json()["id"] == seen[0]
    assert client.get("/memories/mem_nope").status_code == 404
    foreign = seed.add("other", "default", "Other tenant's secret")
    assert client.get(f"/memories/{foreign.id}").status_code == 404


def test_forget_by_id_history_and_events(admin):
    client, seed = admin
    memory = seed.add("acme", "default", "Temporary door code 1234")
    forgotten = client.delete(f"/memories/{memory.id}", params={"reason": "door code 1234"})
    assert forgotten.status_code == 200
    assert forgotten.json()["status"] == "forgotten" and forgotten.json()["content"] is None
    assert client.delete(f"/memories/{memory.id}").status_code == 409
    assert client.delete("/memories/mem_nope").status_code == 404
    history = client.get(f"/memories/{memory.id}/history").json()["data"]
    assert [e["action"] for e in history] == ["added", "forgotten"]
    # The reason is fixed words and the request id: never what the caller wanted gone.
    assert history[1]["reason"].startswith("forgotten through the admin API (request ")
    assert "1234" not in without_generated_ids(json.dumps(history))
    assert client.get("/memories/mem_nope/history").status_code == 404
    feed = client.get("/events", params={"since": 0, "limit": 1}).json()
    assert len(feed["data"]) == 1
    rest = client.get("/events", params={"since": feed["next_cursor"]}).json()
    assert [e["action"] for e in rest["data"]] == ["forgotten"]
    assert client.get("/events", params={"since": -1}).status_code == 422


def test_recall_with_breakdown_and_read_spaces(admin):
    client, seed = admin
    seed.add("acme", "default", "The user is allergic to peanuts", kind="constraint")
    seed.add("acme", "kitchen", "The fridge is empty")
    results = client.post("/recall", json={"query": "peanut allergy", "top_k": 5}).json()["data"]
    assert results[0]["memory"]["content"] == "The user is allergic to peanuts"
    assert "fused" in results[0]["breakdown"] and results[0]["score"] > 0
    both = client.post(
        "/recall",
        json={"query": "food", "top_k": 5},
        headers={"X-Memrelay-Read-Spaces": "default,kitchen"},
    ).json()["data"]
    assert {r["memory"]["space"] for r in both} == {"default", "kitchen"}
    assert client.post("/recall", json={"query": "x", "top_k": 0}).status_code == 422


def test_forget_by_query_dry_run_then_real(admin):
    client, seed = admin
    seed.add("acme", "default", "The user's old address is 5 Elm Street")
    keep = seed.add("acme", "default", "The user enjoys painting")
    dry = client.post("/forget", json={"query": "old address Elm Street", "min_similarity": 0.4})
    assert dry.json()["dry_run"] is True
    assert [m["content"] for m in dry.json()["would_forget"]] == [
        "The user's old address is 5 Elm Street"
    ]
    assert len(client.get("/memories").json()["data"]) == 2
    real = client.post(
        "/forget",
        json={
            "query": "old address Elm Street",
            "min_similarity": 0.4,
            "dry_run": False,
        },
    )
    assert len(real.json()["forgotten"]) == 1
    forgotten_id = real.json()["forgotten"][0]["id"]
    history = client.get(f"/memories/{forgotten_id}/history").json()["data"]
    events = client.get("/events", params={"since": 0}).json()["data"]
    export = client.get("/export").text
    for record in (json.dumps(history), json.dumps(events), export):
        assert "Elm" not in record and "old address" not in record
    assert history[-1]["reason"].startswith("forgotten by query through the admin API")
    with_reason = {"query": "painting", "dry_run": False, "reason": "my PIN is 4711"}
    assert client.post("/forget", json=with_reason).status_code == 422
    assert [m["id"] for m in client.get("/memories").json()["data"]] == [keep.id]


def test_stats_export_import_round_trip(admin, memory_proxy):
    client, seed = admin
    a = seed.add("acme", "default", "Alpha fact")
    seed.add("acme", "work", "Beta fact", kind="constraint")
    client.delete(f"/memories/{a.id}")
    stats = client.get("/stats").json()
    assert stats["total"] == 2 and stats["by_status"] == {"active": 1, "forgotten": 1}
    assert stats["jobs"]["pending"] == 0
    export = client.get("/export")
    assert export.headers["content-type"].startswith("application/x-ndjson")
    lines = export.text.strip().split("\n")
    assert len(lines) == 2 and all(
        json.loads(line)["format"] == "memrelay.memory.v1" for line in lines
    )
    other_server, _ = memory_proxy()
    other = httpx.Client(
        base_url=other_server.url + "/memrelay/v1", headers={"X-Memrelay-Tenant": "acme"}
    )
    result = other.post(
        "/import", content=export.content, headers={"content-type": "application/x-ndjson"}
    )
    assert result.json() == {"imported": 2, "skipped": 0, "errors": []}
    again = other.post("/import", content=export.content).json()
    assert again["skipped"] == 2 and again["imported"] == 0
    bad = other.post("/import", content=b"not json\n").json()
    assert bad["imported"] == 0 and len(bad["errors"]) == 1
    assert other.get("/stats").json()["by_status"] == stats["by_status"]
    other.close()


def test_jobs_list_and_retry(admin, fake):
    client, seed = admin
    from memory_core.sqlite.jobs import SQLiteJobs

    jobs = SQLiteJobs(seed.store)
    seed.run(jobs.enqueue("acme", "default", {"user": "x"}, job_id="job_x", max_attempts=1))
    seed.run(jobs.claim("w", 30))
    seed.run(jobs.fail("job_x", "w", "model exploded", 0))
    listed = client.get("/jobs", params={"status": "dead"}).json()
    assert [j["id"] for j in listed["data"]] == ["job_x"] and listed["counts"]["dead"] == 1
    assert "payload" not in listed["data"][0]
    retried = client.post("/jobs/job_x/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "pending"
    assert client.post("/jobs/job_x/retry").status_code == 400
    assert client.post("/jobs/job_nope/retry").status_code == 404
    assert client.get("/jobs", params={"status": "sleeping"}).status_code == 422


def test_openapi_document_is_served(admin, memory_proxy):
    client, _ = admin
    doc = client.get("../openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) >= {
        "/memrelay/v1/memories",
        "/memrelay/v1/recall",
        "/memrelay/v1/jobs/{job_id}/retry",
    }
