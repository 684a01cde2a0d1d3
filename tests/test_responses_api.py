"""`POST /v1/responses` gets memory like chat completions: recall on the new input, the
blocks after the client's own `instructions`, the answer relayed byte for byte (typed
`event:` lines included), the exchange learned through the same durable queue."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from memory_core.sqlite.db import connect
from proxy.edge.keys import KeyStore
from tests.fake_upstream import Reply, response_object, responses_stream

RULE = "Never use emojis in replies"
FACT = "The user lives in Paris"
BLOCK = (
    "[memrelay:constraints]\n"
    "Rules remembered from earlier conversations. Follow them:\n"
    f"- {RULE} (likely)\n"
    "[/memrelay:constraints]\n\n"
    "[memrelay:context]\n"
    "Background facts remembered from earlier conversations:\n"
    f"- {FACT} (likely)\n"
    "[/memrelay:context]"
)
QUESTION = "Where do I live, and how should you reply to me?"


@pytest.fixture
def seeded(memory_proxy):
    server, seed = memory_proxy()
    seed.add("acme", "default", RULE, kind="constraint")
    seed.add("acme", "default", FACT)
    return server, seed


def client(server, tenant="acme", **headers):
    return openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="sk-test",
        max_retries=0,
        default_headers={"X-Memrelay-Tenant": tenant, **headers},
    )


def sent(fake) -> dict:
    return fake.responses_requests()[-1].json()


def jobs(server_db) -> list[dict]:
    """Finished (non-draft) jobs' payloads, oldest first."""
    conn = connect(server_db)
    try:
        rows = conn.execute("SELECT payload FROM jobs WHERE draft = false ORDER BY seq").fetchall()
    finally:
        conn.close()
    return [json.loads(p) for (p,) in rows]


def wait_for(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def test_create_puts_memory_after_the_clients_own_instructions(fake, seeded):
    server, _ = seeded
    raw = client(server).responses.with_raw_response.create(
        model="m", input=QUESTION, instructions="Answer in one sentence."
    )
    body = sent(fake)
    assert body["instructions"] == "Answer in one sentence.\n\n" + BLOCK
    assert body["input"] == QUESTION  # the input items are the client's, untouched
    assert raw.parse().output_text == "Hello from fake."
    assert raw.headers["x-memrelay-recall-status"] == "ok"
    assert raw.headers["x-memrelay-recalled"] == "2"
    assert raw.headers["x-memrelay-memory-status"] == "queued"
    forwarded = fake.responses_requests()[-1]
    assert forwarded.header("x-memrelay-tenant") is None  # the edge removed it
    assert forwarded.header("authorization") == "Bearer sk-test"


def test_no_instructions_get_the_blocks_and_input_items_are_read(fake, seeded):
    server, _ = seeded
    items = [
        {"role": "developer", "content": "Be kind."},
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]
    client(server).responses.create(model="m", input=items)
    body = sent(fake)
    assert body["instructions"] == BLOCK
    assert body["input"] == items


def test_instructions_given_as_items_get_one_more_developer_item(fake, seeded):
    server, _ = seeded
    own = [{"type": "message", "role": "system", "content": "Be brief."}]
    httpx.post(
        server.url + "/v1/responses",
        headers={"X-Memrelay-Tenant": "acme"},
        json={"model": "m", "input": QUESTION, "instructions": own},
    )
    extra = {"type": "message", "role": "developer", "content": BLOCK}
    assert sent(fake)["instructions"] == [*own, extra]


def test_stream_is_relayed_byte_for_byte_with_typed_event_lines(fake, seeded):
    server, _ = seeded
    with httpx.stream(
        "POST",
        server.url + "/v1/responses",
        headers={"X-Memrelay-Tenant": "acme"},
        json={"model": "m", "input": QUESTION, "stream": True},
    ) as response:
        received = response.read()
        headers = response.headers
    assert received == fake.sent[-1]
    assert received.startswith(b"event: response.created\ndata: ")
    assert b"event: response.completed\n" in received
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["x-memrelay-memory-status"] == "queued"
    assert sent(fake)["instructions"] == BLOCK


def test_json_answer_is_relayed_byte_for_byte(fake, seeded):
    server, _ = seeded
    scripted = json.dumps(response_object("Plain."), indent=3).encode() + b"\n"
    fake.script.append(Reply.raw(scripted))
    response = httpx.post(
        server.url + "/v1/responses",
        headers={"X-Memrelay-Tenant": "acme"},
        json={"model": "m", "input": QUESTION},
    )
    assert response.content == scripted


def test_sdk_stream_helper_and_learning_of_text_and_function_calls(fake, memory_proxy, tmp_path):
    db = tmp_path / "learn.db"
    server, _ = memory_proxy(db=db)
    call = {"name": "book_table", "arguments": '{"city": "Lyon"}', "call_id": "call_7"}
    fake.script.append(Reply.sse(responses_stream("Booking it now.", calls=[call])))
    with client(server).responses.stream(model="m", input="Book me a table in Lyon") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "Booking it now."
    assert final.output[1].name == "book_table"
    assert wait_for(lambda: len(jobs(db)) == 1)
    payload = jobs(db)[0]
    assert payload["user"] == "Book me a table in Lyon"
    assert payload["assistant"] == 'Booking it now.\n[called tool book_table({"city": "Lyon"})]'
    assert payload["model"] == "m"


def test_an_incomplete_answer_is_still_learned(fake, memory_proxy, tmp_path):
    """`response.incomplete` (cut by max_output_tokens) holds what the model said."""
    db = tmp_path / "incomplete.db"
    server, _ = memory_proxy(db=db)
    fake.script.append(Reply.sse(responses_stream("Half an", end="response.incomplete")))
    with httpx.stream(
        "POST",
        server.url + "/v1/responses",
        json={"model": "m", "input": "I like green tea", "stream": True},
    ) as response:
        assert response.headers["x-memrelay-memory-status"] == "queued"
        response.read()
    assert wait_for(lambda: len(jobs(db)) == 1)
    assert jobs(db)[0]["assistant"] == "Half an"


def test_function_call_outputs_and_earlier_turns_reach_learning(fake, memory_proxy, tmp_path):
    db = tmp_path / "items.db"
    server, _ = memory_proxy(db=db)
    items = [
        {"role": "user", "content": "What's the weather where I live?"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny in Munich"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Munich, right?"}]},
        {"role": "user", "content": "Yes, I moved there in May."},
    ]
    client(server).responses.create(model="m", input=items)
    assert wait_for(lambda: len(jobs(db)) == 1)
    payload = jobs(db)[0]
    assert payload["user"] == "Yes, I moved there in May."
    assert payload["context"]["previous_assistant"] == "Munich, right?"
    assert payload["assistant"] == "Hello from fake."


def test_a_json_answer_that_failed_is_not_learned(fake, memory_proxy, tmp_path):
    db = tmp_path / "failed.db"
    server, _ = memory_proxy(db=db)
    fake.script.append(Reply.json(response_object("", status="failed")))
    httpx.post(server.url + "/v1/responses", json={"model": "m", "input": "I like tea"})
    conn = connect(db)
    try:
        assert wait_for(lambda: conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0)
    finally:
        conn.close()


@pytest.mark.parametrize("end", ["response.failed", "cut"])
def test_an_answer_that_fails_or_is_cut_is_not_learned(fake, memory_proxy, tmp_path, end):
    db = tmp_path / "fail.db"
    server, _ = memory_proxy(db=db)
    if end == "cut":
        fake.script.append(Reply.cut(responses_stream()[:4]))
    else:
        fake.script.append(Reply.sse(responses_stream(end=end)))
    try:
        with httpx.stream(
            "POST",
            server.url + "/v1/responses",
            json={"model": "m", "input": "I like tea", "stream": True},
        ) as response:
            response.read()
    except httpx.HTTPError:
        assert end == "cut"
    conn = connect(db)
    try:
        assert wait_for(lambda: conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0)
    finally:
        conn.close()


def test_previous_response_id_threads_are_learned_apart(fake, memory_proxy, tmp_path):
    """Only the new input reaches memrelay; the same words in two threads are two
    exchanges, the same words in one thread one."""
    db = tmp_path / "threads.db"
    server, _ = memory_proxy(db=db)
    c = client(server)

    def status(previous):
        raw = c.responses.with_raw_response.create(
            model="m", input="Yes, that one.", previous_response_id=previous
        )
        return raw.headers["x-memrelay-memory-status"]

    assert [status("resp_a"), status("resp_b"), status("resp_a")] == [
        "queued",
        "queued",
        "duplicate",
    ]
    assert sent(fake)["previous_response_id"] == "resp_a"


def test_tenants_never_see_each_other(fake, seeded):
    server, seed = seeded
    seed.add("other", "default", "Other's secret is 4242")
    client(server, tenant="other").responses.create(model="m", input="What is my secret?")
    assert "4242" in sent(fake)["instructions"]
    assert FACT not in sent(fake)["instructions"]
    client(server).responses.create(model="m", input="What is my secret?")
    assert "4242" not in sent(fake)["instructions"]


def test_keys_bind_the_tenant_on_responses(fake, memory_proxy, tmp_path):
    keys = KeyStore(tmp_path / "keys.json")
    key, _ = keys.create(["acme"])
    server, seed = memory_proxy(keys_file=tmp_path / "keys.json")
    seed.add("other", "default", "Other's secret is 4242")
    for headers, status in [
        ({}, 401),
        ({"X-Memrelay-Key": key, "X-Memrelay-Tenant": "other"}, 403),
        ({"X-Memrelay-Key": key}, 403),  # the default tenant is not the key's either
    ]:
        response = httpx.post(
            server.url + "/v1/responses", headers=headers, json={"model": "m", "input": "secret?"}
        )
        assert response.status_code == status
    assert fake.responses_requests() == []
    ok = httpx.post(
        server.url + "/v1/responses",
        headers={"X-Memrelay-Key": key, "X-Memrelay-Tenant": "acme"},
        json={"model": "m", "input": "secret?"},
    )
    assert ok.status_code == 200 and ok.headers["x-memrelay-memory-status"] == "queued"
    assert "4242" not in sent(fake).get("instructions", "")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"model": "m", "input": 5}', "'input' must be a string or a list"),
        (b'{"model": "m", "input": ["hi"]}', "input[0] must be an object"),
        (b'{"model": "m", "input": "hi", "instructions": 3}', "'instructions' must be"),
    ],
)
def test_malformed_requests_are_a_clear_400(fake, seeded, body, message):
    server, _ = seeded
    response = httpx.post(server.url + "/v1/responses", content=body)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert fake.responses_requests() == []


def test_upstream_errors_pass_through_and_learn_nothing(fake, seeded):
    server, _ = seeded
    error = {"error": {"message": "model not found", "type": "invalid_request_error"}}
    fake.script.append(Reply.json(error, status=404))
    with pytest.raises(openai.NotFoundError) as info:
        client(server).responses.create(model="nope", input="I like tea")
    assert info.value.response.json() == error
    assert info.value.response.headers["x-memrelay-memory-status"] == "skipped"


def test_an_unreachable_upstream_is_a_502_and_learns_nothing(memory_proxy, tmp_path):
    from tests.servers import free_port

    db = tmp_path / "down.db"
    server, _ = memory_proxy(db=db, upstream_url=f"http://127.0.0.1:{free_port()}", retries=0)
    response = httpx.post(server.url + "/v1/responses", json={"model": "m", "input": "I like tea"})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"
    assert response.headers["x-memrelay-memory-status"] == "skipped"
    conn = connect(db)
    try:
        assert wait_for(lambda: conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0)
    finally:
        conn.close()


def test_memory_off_forwards_the_request_as_sent(fake, seeded):
    server, _ = seeded
    body = b'{"model":"m", "input":"Where do I live?",  "instructions":"x"}'
    response = httpx.post(
        server.url + "/v1/responses",
        headers={"X-Memrelay-Tenant": "acme", "X-Memrelay-Memory": "off"},
        content=body,
    )
    assert response.headers["x-memrelay-recall-status"] == "off"
    assert fake.responses_requests()[-1].body == body


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/responses/resp_1"),
        ("DELETE", "/v1/responses/resp_1"),
        ("POST", "/v1/responses/resp_1/cancel"),
        ("GET", "/v1/responses/resp_1/input_items"),
        ("POST", "/v1/responses/input_tokens"),
    ],
)
def test_other_responses_routes_pass_through(fake, seeded, method, path):
    server, _ = seeded
    response = httpx.request(
        method, server.url + path, headers={"X-Memrelay-Tenant": "acme"}, content=b"{}"
    )
    assert response.json()["echo"] == path
    assert "x-memrelay-recall-status" not in response.headers
    assert fake.requests[-1].body == b"{}"
