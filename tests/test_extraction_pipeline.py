"""Extraction and supersession end to end: the proxy learns from every exchange."""

from __future__ import annotations

import json
import random
import time

import httpx
import openai
import pytest

from memory_core import ListQuery
from memory_core.sqlite.jobs import SQLiteJobs
from tests.extraction_script import ScriptedExtraction, fact
from tests.fake_upstream import Reply, chat_chunk, completion
from tests.text_checks import without_generated_ids


@pytest.fixture
def script(fake):
    scripted = ScriptedExtraction()
    fake.responder = scripted
    return scripted


def client(server, tenant="acme", **headers):
    return openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="sk-user",
        max_retries=0,
        default_headers={"X-Memrelay-Tenant": tenant, **headers},
    )


def say(server, text, tenant="acme", **headers):
    return client(server, tenant, **headers).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}]
    )


def drain(seed, at_least=1, timeout=20.0):
    """Wait until at least `at_least` jobs exist (they are enqueued just after the
    answer) and none is pending or leased."""
    jobs = SQLiteJobs(seed.store)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = seed.run(jobs.job_counts())
        if sum(counts.values()) >= at_least and counts["pending"] == 0 and counts["leased"] == 0:
            return counts
        time.sleep(0.05)
    raise AssertionError(f"queue did not drain: {counts}")


def wait_jobs(seed, count, timeout=10.0):
    """Jobs are written just after the answer: wait until `count` exist."""
    jobs = SQLiteJobs(seed.store)
    deadline = time.monotonic() + timeout
    while sum(seed.run(jobs.job_counts()).values()) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def injected(fake):
    """System content of the last proxied chat request (not the workers' own calls,
    which may arrive right after it)."""
    proxied = [r for r in fake.chat_requests() if b"memrelay-extraction" not in r.body]
    messages = proxied[-1].json()["messages"]
    return messages[0]["content"] if messages[0]["role"] == "system" else ""


def active(seed, tenant="acme"):
    return seed.run(seed.store.list(ListQuery(tenant, limit=1000))).items


def test_correction_supersedes_and_is_never_injected_again(fake, memory_proxy, script):
    server, seed = memory_proxy(extraction_workers=1)
    script.facts["formal tone"] = [
        fact(
            "The user prefers a formal tone in emails", "preference", "user", "email_tone", "formal"
        )
    ]
    script.facts["casual"] = [
        fact("The user prefers casual emails", "preference", "user", "email tone", "casual")
    ]
    response = say(server, "I prefer a formal tone in emails")
    assert response.headers["x-memrelay-memory-status"] == "queued"
    drain(seed, 1)
    say(server, "Actually, keep my emails casual")
    drain(seed, 2)
    say(server, "Write an email to my landlord about the heating")
    block = injected(fake)
    assert "casual" in block and "formal" not in block
    memories = seed.run(seed.store.list(ListQuery("acme", statuses=None, limit=100))).items
    old = next(m for m in memories if m.value == "formal")
    new = next(m for m in memories if m.value == "casual")
    assert old.status == "superseded" and old.superseded_by == new.id
    history = seed.run(seed.store.history("acme", old.id))
    assert history[-1].action == "superseded" and history[-1].reason == "same slot, new value"
    assert history[-1].actor == "extraction"
    # The extraction call used the request's model and credentials.
    call = next(r for r in fake.chat_requests() if b"memrelay-extraction" in r.body)
    assert call.json()["model"] == "m" and call.header("authorization") == "Bearer sk-user"


def test_assistant_claim_cannot_override_the_user(fake, memory_proxy, script):
    server, seed = memory_proxy(extraction_workers=1)
    script.facts["live in Lyon"] = [fact("The user lives in Lyon", "fact", "user", "city", "Lyon")]
    script.facts["moving"] = [
        fact(
            "The user lives in Marseille",
            "fact",
            "user",
            "city",
            "Marseille",
            stated_by="assistant",
        )
    ]
    say(server, "I live in Lyon")
    drain(seed, 1)
    say(server, "I am thinking about moving")
    drain(seed, 2)
    cities = [m.value for m in active(seed) if m.attribute == "city"]
    assert cities == ["Lyon"]
    say(server, "Where do I live?")
    assert "Lyon" in injected(fake) and "Marseille" not in injected(fake)


def test_same_fact_twice_reinforces_instead_of_duplicating(fake, memory_proxy, script):
    server, seed = memory_proxy(extraction_workers=1)
    script.facts["tea"] = [fact("The user drinks green tea every morning", "preference")]
    for i, text in enumerate(["I love my tea", "my tea again this morning", "more tea, please"]):
        say(server, text)  # three exchanges stating one fact: corroboration
        drain(seed, i + 1)
    memories = active(seed)
    assert len(memories) == 1 and memories[0].confidence > 0.9
    assert [e.action for e in seed.run(seed.store.history("acme", memories[0].id))] == [
        "added",
        "reinforced",
        "reinforced",
    ]


def test_ambiguous_pair_is_classified_once_by_the_model(fake, memory_proxy, script):
    server, seed = memory_proxy(extraction_workers=1)
    script.facts["dog"] = [fact("The user has a dog named Rex")]
    script.facts["puppy"] = [fact("The user has a dog called Max")]
    script.relation = "updates"
    say(server, "My dog")
    drain(seed, 1)
    say(server, "New puppy")
    drain(seed, 2)
    assert [m.content for m in active(seed)] == ["The user has a dog called Max"]
    assert sum("You compare" in c["messages"][0]["content"] for c in script.calls) == 1


def test_explicit_forget_request_forgets_only_a_clear_match(fake, memory_proxy, script):
    server, seed = memory_proxy(extraction_workers=1)
    address = seed.add("acme", "default", "The user's old address is 12 Rue Verte, Lyon")
    seed.add("acme", "default", "The user likes jazz")
    script.forget["forget my old address"] = ["my old address"]
    script.choose = lambda candidates: next(
        (c["id"] for c in candidates if "Rue Verte" in c["memory"]), None
    )
    say(server, "Please forget my old address")
    drain(seed, 1)
    assert seed.run(seed.store.get("acme", address.id)).status == "forgotten"
    assert [m.content for m in active(seed)] == ["The user likes jazz"]
    # Ambiguous: the model names no single memory, so nothing is forgotten.
    script.forget["forget that thing"] = ["that thing"]
    script.choose = lambda candidates: None
    say(server, "forget that thing")
    drain(seed, 2)
    assert [m.content for m in active(seed)] == ["The user likes jazz"]
    # A made-up id is not obeyed either.
    script.choose = lambda candidates: "mem_invented"
    say(server, "now forget that thing")
    drain(seed, 3)
    assert [m.content for m in active(seed)] == ["The user likes jazz"]


def test_a_forget_in_another_space_waits_for_the_fact_it_forgets(fake, memory_proxy, script):
    """Two workers; "forget my locker code" said in `work` (reading `personal`) right
    after the code was told in `personal`, whose job is slow: ordered per space only,
    the forget ran first, found nothing, and the code was stored after it for good."""
    server, seed = memory_proxy(extraction_workers=2)
    script.facts["locker code is 5521"] = [fact("The user's locker code is 5521")]

    def slow_for_the_code(request):
        reply = script(request)
        if reply is not None and b"locker code is 5521" in request.body:
            reply.first_delay = 2.0  # the model takes its time on the exchange with the code
        return reply

    fake.responder = slow_for_the_code
    say(server, "My locker code is 5521", **{"X-Memrelay-Write-Space": "personal"})
    headers = {"X-Memrelay-Write-Space": "work", "X-Memrelay-Read-Spaces": "work,personal"}
    say(server, "Please forget my locker code", **headers)
    drain(seed, 2)
    assert [m.content for m in active(seed)] == []
    jobs = seed.run(SQLiteJobs(seed.store).list_jobs("acme", None, 10))
    assert [(j.space, j.forgets) for j in jobs] == [("work", True), ("personal", False)]


def test_a_forget_in_a_chat_erases_the_dead_job_that_would_learn_it_again(
    fake, memory_proxy, script
):
    """The exchange with the locker code failed for good (dead, its text kept for a
    retry); "forget my locker code" said later erases that text, and the admin API's
    retry answers 400 invalid_input instead of learning the code again. A dead job of
    the same tenant without the words keeps its text and can be retried."""
    server, seed = memory_proxy(
        extraction_workers=1, extraction_max_attempts=1, extraction_retry_base_seconds=0.01
    )
    script.failure_rate = 1.0
    say(server, "My locker code is 5521")
    say(server, "My bike is red")
    assert drain(seed, 2)["dead"] == 2
    script.failure_rate = 0.0
    say(server, "Please forget my locker code")
    drain(seed, 3)
    jobs = SQLiteJobs(seed.store)
    dead = {j.id: j for j in seed.run(jobs.list_jobs("acme", ["dead"]))}
    erased = [j for j in dead.values() if j.payload is None]
    kept = [j for j in dead.values() if j.payload is not None]
    assert len(erased) == 1 and erased[0].last_error.startswith("payload erased by a forget")
    assert [j.payload["user"] for j in kept] == ["My bike is red"]
    rows = seed.run(seed.store.run_read(lambda c: c.execute("SELECT * FROM jobs").fetchall()))
    assert "5521" not in without_generated_ids(str(rows))
    admin = httpx.Client(
        base_url=server.url + "/memrelay/v1", headers={"X-Memrelay-Tenant": "acme"}
    )
    refused = admin.post(f"/jobs/{erased[0].id}/retry")
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_input"
    assert "erased by a forget" in refused.json()["error"]["message"]
    assert admin.post(f"/jobs/{kept[0].id}/retry").json()["status"] == "pending"
    admin.close()


def test_what_is_not_queued(fake, memory_proxy, script):
    server, seed = memory_proxy(extraction_workers=0, ignore_patterns=["^heartbeat$"])
    jobs = SQLiteJobs(seed.store)
    assert say(server, "heartbeat").headers["x-memrelay-memory-status"] == "skipped"
    for mode in ("off", "read"):
        assert (
            say(server, "hello", **{"X-Memrelay-Memory": mode}).headers["x-memrelay-memory-status"]
            == "off"
        )
    fake.script.append(Reply.json({"error": {"message": "nope"}}, status=500))
    with pytest.raises(openai.InternalServerError) as info:
        say(server, "this fails upstream")
    assert info.value.response.headers["x-memrelay-memory-status"] == "skipped"
    # A stream the upstream cuts short is not learned from.
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
    time.sleep(0.3)
    assert seed.run(jobs.job_counts()) == {"pending": 0, "leased": 0, "done": 0, "dead": 0}
    assert (
        say(server, "write mode", **{"X-Memrelay-Memory": "write"}).headers[
            "x-memrelay-memory-status"
        ]
        == "queued"
    )
    wait_jobs(seed, 1)
    assert seed.run(jobs.job_counts())["pending"] == 1


def test_streamed_exchange_is_queued_with_scrubbed_reply(fake, memory_proxy, script):
    server, seed = memory_proxy(extraction_workers=0)
    echo = "[memrelay:context]\n- secret injected line\n[/memrelay:context] Sure, noted."
    fake.script.append(
        Reply.sse(
            [
                chat_chunk({"role": "assistant", "content": echo}),
                chat_chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c",
                                "type": "function",
                                "function": {"name": "save", "arguments": "{}"},
                            }
                        ]
                    }
                ),
                chat_chunk({}, finish="stop"),
                b"data: [DONE]\n\n",
            ]
        )
    )
    stream = client(server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "remember this"}], stream=True
    )
    list(stream)
    wait_jobs(seed, 1)
    job = seed.run(SQLiteJobs(seed.store).list_jobs("acme"))[0]
    assert job.payload["user"] == "remember this"
    assert job.payload["assistant"] == "Sure, noted.\n[called tool save({})]"
    assert job.space == "default" and job.tenant == "acme"


def test_client_hanging_up_right_after_done_still_queues_the_exchange(fake, memory_proxy, script):
    """SDKs stop reading at `[DONE]` and may close before the stream's last frame; the
    answer they got was whole, so the exchange is still learned from."""
    server, seed = memory_proxy(extraction_workers=0)
    whole = b"".join(
        [
            chat_chunk({"role": "assistant", "content": "Noted."}),
            chat_chunk({}, finish="stop"),
            b"data: [DONE]\n\n",
        ]
    )
    fake.script.append(Reply.sse([whole, b": upstream still holding the line\n\n"], delay=1.0))
    received = b""
    with httpx.Client(base_url=server.url, timeout=10) as http:
        with http.stream(
            "POST",
            "/v1/chat/completions",
            headers={"X-Memrelay-Tenant": "acme"},
            json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        ) as response:
            for chunk in response.iter_raw():
                received += chunk
                if b"[DONE]" in received:
                    break  # hang up while the upstream is still open
    assert fake.disconnected.wait(5)
    wait_jobs(seed, 1)
    jobs = seed.run(SQLiteJobs(seed.store).list_jobs("acme"))
    assert [j.payload["assistant"] for j in jobs] == ["Noted."]


def test_extraction_failures_never_change_the_answer(fake, memory_proxy, script):
    script.failure_rate = 1.0
    server, seed = memory_proxy(
        extraction_workers=2, extraction_max_attempts=2, extraction_retry_base_seconds=0.01
    )
    answers = [say(server, f"message {i}").text for i in range(5)]
    assert all(json.loads(a) == completion() for a in answers)
    counts = drain(seed, 5)
    assert counts["dead"] == 5
    dead = seed.run(SQLiteJobs(seed.store).list_jobs("acme", ["dead"]))
    assert all(j.last_error and j.attempts == 2 and j.payload for j in dead)


def test_thousand_exchanges_twenty_tenants_none_lost_none_crossed(fake, memory_proxy, script):
    server, seed = memory_proxy(
        extraction_workers=4,
        extraction_max_attempts=3,
        extraction_retry_base_seconds=0.01,
        recall_budget_ms=1000,
    )
    script.failure_rate = 0.3
    rng = random.Random(5)
    tenants = [f"t{i:02d}" for i in range(20)]
    for i in range(1000):
        tenant = rng.choice(tenants)
        script.facts[f"#{i}:"] = [fact(f"Tenant {tenant} note number {i}")]
    http = httpx.Client(base_url=server.url, timeout=30)
    sent: dict[str, str] = {}
    for i in range(1000):
        tenant = next(f["content"].split()[1] for f in script.facts[f"#{i}:"])
        response = http.post(
            "/v1/chat/completions",
            headers={"X-Memrelay-Tenant": tenant, "X-Memrelay-Memory": "write"},
            json={"model": "m", "messages": [{"role": "user", "content": f"#{i}: hi"}]},
        )
        assert response.status_code == 200 and response.json() == completion()
        sent[f"#{i}:"] = tenant
    counts = drain(seed, 1000, timeout=240)
    assert counts["done"] + counts["dead"] == 1000
    jobs = SQLiteJobs(seed.store)
    all_jobs = seed.run(jobs.list_jobs(None, limit=5000))
    assert len(all_jobs) == 1000
    dead = {j.payload["user"].split()[0] for j in all_jobs if j.status == "dead"}
    total = 0
    for tenant in tenants:
        memories = seed.run(seed.store.list(ListQuery(tenant, limit=1000))).items
        for memory in memories:
            assert memory.content.startswith(f"Tenant {tenant} note")
        total += len(memories)
        numbers = [m.content.rsplit(" ", 1)[1] for m in memories]
        assert len(numbers) == len(set(numbers))
    from collections import Counter

    actions = Counter(o["action"] for j in all_jobs if j.result for o in j.result["outcomes"])
    assert total == 1000 - len(dead), actions


def test_interrupted_job_is_finished_after_restart_without_duplicates(
    fake, memory_proxy, script, tmp_path
):
    """A worker dies after committing the first of two facts; a new run finishes the job."""
    from extraction.facts import Fact
    from extraction.reconcile import Reconciler

    script.facts["two facts"] = [fact("The user plays the cello"), fact("The user speaks Welsh")]
    db = tmp_path / "crash.db"
    server, seed = memory_proxy(db=db, extraction_workers=0)
    say(server, "two facts about me")
    wait_jobs(seed, 1)
    jobs = SQLiteJobs(seed.store)
    job = seed.run(jobs.claim("worker-that-dies", lease_seconds=0.5))
    assert job is not None
    provenance = {"job_id": job.id, "stated_by": "user"}
    seed.run(
        Reconciler(seed.store, None).apply(
            "acme", "default", Fact("The user plays the cello"), provenance
        )
    )
    # The worker is gone; a new memrelay starts on the same file with workers.
    _restarted, seed2 = memory_proxy(db=db, extraction_workers=1, extraction_lease_seconds=5)
    drain(seed2, 1)
    contents = sorted(m.content for m in active(seed2))
    assert contents == ["The user plays the cello", "The user speaks Welsh"]
    finished = seed2.run(SQLiteJobs(seed2.store).get_job("acme", job.id))
    assert finished.status == "done" and finished.payload is None
    assert [o["action"] for o in finished.result["outcomes"]] == ["unchanged", "added"]
