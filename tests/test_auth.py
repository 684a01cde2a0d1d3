"""Tenancy bound to keys: the key/tenant matrix on the proxy and the admin API."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from proxy.edge.keys import KeyStore


@pytest.fixture
def keyed(memory_proxy, tmp_path):
    keys = KeyStore(tmp_path / "keys.json")
    acme, _ = keys.create(["acme"], name="acme app")
    beta, _ = keys.create(["beta"])
    root, _ = keys.create([], admin=True)
    revoked, record = keys.create(["acme"])
    keys.revoke(record.id)
    server, seed = memory_proxy(keys_file=tmp_path / "keys.json")
    seed.add("acme", "default", "Acme's secret launch date is May 5")
    return server, {"acme": acme, "beta": beta, "admin": root, "revoked": revoked}


MATRIX = [
    ("acme", "acme", 200),
    ("acme", "beta", 403),
    ("beta", "acme", 403),
    ("admin", "acme", 200),
    ("admin", "beta", 200),
    ("revoked", "acme", 401),
    ("wrong", "acme", 401),
    (None, "acme", 401),
]


@pytest.mark.parametrize(("key", "tenant", "status"), MATRIX)
def test_matrix_on_chat_completions(fake, keyed, key, tenant, status):
    server, keys = keyed
    headers = {"X-Memrelay-Tenant": tenant, "Authorization": "Bearer sk-upstream"}
    if key:
        headers["X-Memrelay-Key"] = keys.get(key, "mr_wrong")
    response = httpx.post(
        server.url + "/v1/chat/completions",
        headers=headers,
        json={"model": "m", "messages": [{"role": "user", "content": "launch date?"}]},
    )
    assert response.status_code == status
    if status == 200:
        sent = fake.chat_requests()[-1]
        assert sent.header("authorization") == "Bearer sk-upstream"
        assert sent.header("x-memrelay-key") is None
        assert ("May 5" in sent.json()["messages"][0]["content"]) == (tenant == "acme")
    else:
        assert fake.requests == []
        assert response.json()["error"]["code"] in ("invalid_memrelay_key", "tenant_not_allowed")


@pytest.mark.parametrize(("key", "tenant", "status"), MATRIX)
def test_matrix_on_admin_api(fake, keyed, key, tenant, status):
    server, keys = keyed
    headers = {"X-Memrelay-Tenant": tenant}
    if key:
        headers["X-Memrelay-Key"] = keys.get(key, "mr_wrong")
    response = httpx.get(server.url + "/memrelay/v1/memories", headers=headers)
    assert response.status_code == status
    if status == 200:
        contents = [m["content"] for m in response.json()["data"]]
        assert contents == (["Acme's secret launch date is May 5"] if tenant == "acme" else [])


def test_passthrough_needs_a_key_but_no_tenant(fake, keyed):
    server, keys = keyed
    assert httpx.get(server.url + "/v1/models").status_code == 401
    ok = httpx.get(server.url + "/v1/models", headers={"X-Memrelay-Key": keys["beta"]})
    assert ok.status_code == 200
    assert httpx.get(server.url + "/memrelay/healthz").status_code == 200


def test_default_tenant_is_checked_too(fake, keyed):
    server, keys = keyed
    response = httpx.post(
        server.url + "/v1/chat/completions",
        headers={"X-Memrelay-Key": keys["acme"]},
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 403  # no tenant header means "default", not acme


def test_bearer_mode_replaces_the_key_with_memrelays_upstream_key(fake, memory_proxy, tmp_path):
    keys = KeyStore(tmp_path / "keys.json")
    acme, _ = keys.create(["acme"])
    server, _ = memory_proxy(keys_file=tmp_path / "keys.json", upstream_api_key="sk-real-upstream")
    client = openai.OpenAI(
        base_url=server.url + "/v1",
        api_key=acme,
        max_retries=0,
        default_headers={"X-Memrelay-Tenant": "acme"},
    )
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert fake.chat_requests()[-1].header("authorization") == "Bearer sk-real-upstream"
    client.models.list()
    assert fake.requests[-1].header("authorization") == "Bearer sk-real-upstream"
    intruder = openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="sk-guess",
        max_retries=0,
        default_headers={"X-Memrelay-Tenant": "acme"},
    )
    with pytest.raises(openai.AuthenticationError):
        intruder.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def test_keys_are_stored_hashed_and_never_logged(fake, keyed, tmp_path, caplog):
    server, keys = keyed
    stored = (tmp_path / "keys.json").read_text()
    assert all(key not in stored for key in keys.values())
    with caplog.at_level(logging.DEBUG):
        httpx.get(
            server.url + "/memrelay/v1/memories",
            headers={"X-Memrelay-Key": keys["beta"], "X-Memrelay-Tenant": "acme"},
        )
        response = httpx.get(
            server.url + "/memrelay/v1/memories", headers={"X-Memrelay-Key": "mr_leak_me"}
        )
    assert "mr_leak_me" not in response.text
    assert all(key not in caplog.text for key in [*keys.values(), "mr_leak_me"])
