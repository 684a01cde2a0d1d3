"""Chat completions wherever apps send them (`/chat/completions`, a base_url without /v1)
and whatever the server's chat template accepts: the memory placement setting, and the
fallback that moves the memory into the user turn when a template has no system role."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from memory_core.sqlite.db import connect
from proxy.edge.keys import KeyStore
from tests.chat_template import gemma_responder, render
from tests.fake_upstream import Reply

FACT = "The user lives in Paris"
BLOCK = (
    "[memrelay:context]\n"
    "Background facts remembered from earlier conversations:\n"
    f"- {FACT} (likely)\n"
    "[/memrelay:context]"
)
USER = {"role": "user", "content": "Where do I live?"}


def client(server, base="/v1", tenant="acme", **headers):
    return openai.OpenAI(
        base_url=server.url + base,
        api_key="sk-test",
        max_retries=0,
        default_headers={"X-Memrelay-Tenant": tenant, **headers},
    )


def chat(server, messages=None, model="gemma-2", **kwargs):
    return client(server).chat.completions.with_raw_response.create(
        model=model, messages=messages or [USER], **kwargs
    )


def sent_messages(fake, index=-1):
    return fake.chat_requests()[index].json()["messages"]


def finished_jobs(db) -> int:
    conn = connect(db)
    try:
        return conn.execute("SELECT count(*) FROM jobs WHERE draft = false").fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def seeded(memory_proxy):
    def start(**settings):
        server, seed = memory_proxy(**settings)
        seed.add("acme", "default", FACT)
        return server, seed

    return start


def test_chat_completions_without_v1_gets_memory_and_headers(fake, seeded):
    server, _ = seeded()
    raw = client(server, base="").chat.completions.with_raw_response.create(
        model="m", messages=[USER]
    )
    assert fake.chat_requests()[-1].path == "/v1/chat/completions"
    assert sent_messages(fake) == [{"role": "system", "content": BLOCK}, USER]
    assert raw.headers["x-memrelay-recall-status"] == "ok"
    assert raw.headers["x-memrelay-memory-status"] == "queued"
    assert raw.parse().choices[0].message.content == "Hello from fake."


def test_chat_completions_without_v1_goes_through_the_edge_checks(fake, seeded, tmp_path):
    keys = KeyStore(tmp_path / "keys.json")
    key, _ = keys.create(["acme"])
    server, seed = seeded(keys_file=tmp_path / "keys.json")
    seed.add("other", "default", "Other's code is 4242")
    url = server.url + "/chat/completions"
    body = {"model": "m", "messages": [USER]}
    assert httpx.post(url, json=body).status_code == 401
    refused = httpx.post(
        url, json=body, headers={"X-Memrelay-Key": key, "X-Memrelay-Tenant": "other"}
    )
    assert refused.status_code == 403
    defaulted = httpx.post(url, json=body, headers={"X-Memrelay-Key": key})
    assert defaulted.status_code == 403  # the default tenant is not the key's either
    assert fake.chat_requests() == []
    ok = httpx.post(url, json=body, headers={"X-Memrelay-Key": key, "X-Memrelay-Tenant": "acme"})
    assert ok.status_code == 200 and FACT in sent_messages(fake)[0]["content"]
    assert "4242" not in json.dumps(sent_messages(fake))
    assert fake.chat_requests()[-1].header("x-memrelay-key") is None


def test_placement_developer_inserts_a_developer_message(fake, seeded):
    server, _ = seeded(memory_placement="developer")
    chat(server)
    assert sent_messages(fake) == [{"role": "developer", "content": BLOCK}, USER]
    system = {"role": "system", "content": "Be brief."}
    chat(server, [system, USER])
    assert sent_messages(fake) == [{"role": "system", "content": "Be brief.\n\n" + BLOCK}, USER]


def test_placement_user_prepends_to_the_first_user_message(fake, seeded):
    server, _ = seeded(memory_placement="user")
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello."},
        USER,
    ]
    chat(server, turns)
    first = {"role": "user", "content": [{"type": "text", "text": BLOCK}, *turns[0]["content"]]}
    assert sent_messages(fake) == [first, *turns[1:]]
    chat(server)
    assert sent_messages(fake) == [{"role": "user", "content": BLOCK + "\n\nWhere do I live?"}]


def test_a_template_without_system_role_gets_the_memory_in_the_user_turn(fake, seeded, tmp_path):
    """The first request for a model is refused by the Gemma-2 template and retried once
    with the memory in the user turn; later requests for that model go there directly;
    another model still gets a system message first."""
    db = tmp_path / "gemma.db"
    server, _ = seeded(db=db)
    fake.responder = gemma_responder
    raw = chat(server)
    expected = [{"role": "user", "content": BLOCK + "\n\nWhere do I live?"}]
    assert raw.parse().choices[0].message.content == render(expected)
    assert [r.json()["messages"][0]["role"] for r in fake.chat_requests()] == ["system", "user"]
    assert raw.headers["x-memrelay-recall-status"] == "ok"
    assert raw.headers["x-memrelay-memory-status"] == "queued"
    assert finished_jobs(db) == 1
    conn = connect(db)
    payload = json.loads(conn.execute("SELECT payload FROM jobs").fetchone()[0])
    conn.close()
    assert payload["user"] == "Where do I live?"  # what the user said, not the memory
    fake.requests.clear()
    chat(server, [{"role": "user", "content": "And my city?"}])
    assert [r.json()["messages"][0]["role"] for r in fake.chat_requests()] == ["user"]
    fake.requests.clear()
    fake.responder = None
    chat(server, model="another-model")
    assert sent_messages(fake)[0]["role"] == "system"


def test_a_streamed_answer_after_the_fallback_is_sent_once(fake, seeded, tmp_path):
    db = tmp_path / "stream.db"
    server, _ = seeded(db=db)
    fake.responder = gemma_responder
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        headers={"X-Memrelay-Tenant": "acme"},
        json={"model": "gemma-2", "messages": [USER], "stream": True},
    ) as response:
        received = response.read()
        assert response.headers["x-memrelay-memory-status"] == "queued"
    assert received == fake.sent[-1]  # exactly the second answer's bytes, nothing of the 400
    assert received.count(b"data: [DONE]") == 1
    assert b"System role not supported" not in received
    assert len(fake.chat_requests()) == 2
    assert finished_jobs(db) == 1


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (Reply.json({"error": {"message": "Conversation roles must alternate"}}, 400), "other"),
        (Reply.json({"error": {"message": "System role not supported"}}, 500), "not a 400"),
        (Reply.json({"error": {"message": "unknown field: 'temprature'"}}, 400), "other"),
    ],
)
def test_nothing_else_is_retried(fake, seeded, reply, why):
    server, _ = seeded(retries=0)
    fake.script.append(reply)
    with pytest.raises(openai.APIStatusError) as info:
        chat(server)
    assert info.value.response.content == reply.body, why
    assert len(fake.chat_requests()) == 1
    assert info.value.response.headers["x-memrelay-memory-status"] == "skipped"
    chat(server)  # the model was not remembered: a system message again
    assert sent_messages(fake)[0]["role"] == "system"


def test_the_clients_own_system_message_is_never_moved(fake, seeded):
    """memrelay only undoes what it added: a client's system message refused by the
    template is the client's 400, relayed as it came."""
    server, _ = seeded()
    fake.responder = gemma_responder
    with pytest.raises(openai.BadRequestError) as info:
        chat(server, [{"role": "system", "content": "Be brief."}, USER])
    assert info.value.response.json()["message"] == "System role not supported"
    assert len(fake.chat_requests()) == 1


def test_no_memory_means_no_system_message_and_no_retry(fake, memory_proxy):
    server, _ = memory_proxy()  # nothing to recall
    fake.responder = gemma_responder
    raw = chat(server)
    assert raw.headers["x-memrelay-recall-status"] == "empty"
    assert sent_messages(fake) == [USER] and len(fake.chat_requests()) == 1


def test_the_fallback_can_be_turned_off(fake, seeded):
    server, _ = seeded(memory_placement_fallback=False)
    fake.responder = gemma_responder
    with pytest.raises(openai.BadRequestError):
        chat(server)
    assert len(fake.chat_requests()) == 1


def test_a_refused_retry_is_relayed_and_not_retried_again(fake, seeded):
    server, _ = seeded()
    refused = {"object": "error", "message": "System role not supported", "code": 400}
    fake.script.extend([Reply.json(refused, 400), Reply.json({"error": {"message": "no"}}, 400)])
    with pytest.raises(openai.BadRequestError) as info:
        chat(server)
    assert info.value.response.json() == {"error": {"message": "no"}}
    assert [m[0]["role"] for m in (r.json()["messages"] for r in fake.chat_requests())] == [
        "system",
        "user",
    ]


def test_without_a_user_turn_the_refusal_is_relayed_not_resent(fake, seeded):
    """No user message to carry the memory: sending the same body again would be
    refused again, so the 400 is relayed after one try."""
    server, _ = seeded()
    fake.responder = gemma_responder
    with pytest.raises(openai.BadRequestError) as info:
        chat(server, [{"role": "assistant", "content": "You live in Paris."}])
    assert info.value.response.json()["message"] == "System role not supported"
    assert len(fake.chat_requests()) == 1
