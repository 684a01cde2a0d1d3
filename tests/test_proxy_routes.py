"""Passthrough of every other route, header rules, health and the upstream URL forms."""

from __future__ import annotations

import gzip
import json

import httpx
import openai
import pytest

from tests.fake_upstream import Reply


def test_models_route_passes_through_with_sdk(fake, proxy):
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test")
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    assert fake.requests[0].path == "/v1/models"
    assert fake.requests[0].header("authorization") == "Bearer sk-test"


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_any_method_path_and_query_pass_through(fake, proxy, method):
    body = b"" if method in ("GET", "DELETE") else b'{"input": "x"}'
    response = httpx.request(
        method,
        proxy.url + "/v1/files/abc?purpose=batch&x=%20y",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 200
    got = fake.requests[0]
    assert (got.method, got.path, got.query) == (method, "/v1/files/abc", b"purpose=batch&x=%20y")
    assert got.body == body
    assert response.json() == {"echo": "/v1/files/abc", "method": method, "size": len(body)}


def test_large_upload_streams_through(fake, proxy):
    payload = bytes(range(256)) * 20_000  # 5 MB, over the buffered size
    response = httpx.post(
        proxy.url + "/v1/audio/transcriptions",
        content=payload,
        headers={"content-type": "application/octet-stream"},
    )
    assert response.json()["size"] == len(payload)
    assert fake.requests[0].body == payload
    assert fake.requests[0].header("content-length") == str(len(payload))


def test_chat_completions_get_is_passed_through(fake, proxy):
    response = httpx.get(proxy.url + "/v1/chat/completions?limit=2")
    assert response.status_code == 200
    assert fake.requests[0].method == "GET" and fake.requests[0].query == b"limit=2"


def test_header_rules(fake, fake_url, proxy):
    fake.script.append(
        Reply.json(
            {"ok": True},
            headers={
                "x-request-id": "req_123",
                "x-ratelimit-remaining-tokens": "99",
                "openai-processing-ms": "12",
                "keep-alive": "timeout=5",
            },
        )
    )
    response = httpx.post(
        proxy.url + "/v1/embeddings",
        json={"input": "x"},
        headers={
            "Authorization": "Bearer sk-up",
            "OpenAI-Organization": "org-1",
            "OpenAI-Project": "proj-1",
            "api-key": "azure-key",
            "X-Custom": "kept",
            "X-Memrelay-Tenant": "t1",
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "drop-me",
            "TE": "trailers",
            "Proxy-Authorization": "Basic abc",
        },
    )
    got = fake.requests[0]
    assert got.header("authorization") == "Bearer sk-up"
    assert got.header("openai-organization") == "org-1"
    assert got.header("openai-project") == "proj-1"
    assert got.header("api-key") == "azure-key"
    assert got.header("x-custom") == "kept"
    for dropped in (
        "x-memrelay-tenant",
        "x-hop",
        "te",
        "proxy-authorization",
    ):
        assert got.header(dropped) is None, dropped
    assert got.header("host") == fake_url.removeprefix("http://")  # set for the upstream
    assert response.headers["x-request-id"] == "req_123"
    assert response.headers["x-ratelimit-remaining-tokens"] == "99"
    assert response.headers["openai-processing-ms"] == "12"
    assert "keep-alive" not in response.headers
    assert float(response.headers["x-memrelay-overhead-ms"]) >= 0


def test_streaming_response_headers_reach_client(fake, proxy):
    fake.script.append(Reply.sse([b"data: [DONE]\n\n"], headers={"x-request-id": "req_s"}))
    with httpx.stream(
        "POST",
        proxy.url + "/v1/chat/completions",
        json={"model": "m", "messages": [], "stream": True},
    ) as response:
        assert response.headers["x-request-id"] == "req_s"
        assert "x-memrelay-overhead-ms" in response.headers
        response.read()


def test_memrelay_headers_never_reach_upstream_on_chat(fake, proxy):
    httpx.post(
        proxy.url + "/v1/chat/completions",
        json={"model": "m", "messages": []},
        headers={"X-Memrelay-Tenant": "acme", "Authorization": "Bearer k"},
    )
    got = fake.chat_requests()[0]
    assert got.header("x-memrelay-tenant") is None
    assert got.header("authorization") == "Bearer k"


def test_compressed_passthrough_keeps_encoding(fake, proxy):
    raw = gzip.compress(json.dumps({"data": "x" * 1000}).encode())
    fake.script.append(Reply.raw(raw, headers={"content-encoding": "gzip"}))
    with httpx.stream("GET", proxy.url + "/v1/models", headers={"accept-encoding": "gzip"}) as r:
        assert r.headers["content-encoding"] == "gzip"
        assert int(r.headers["content-length"]) == len(raw)
        assert b"".join(r.iter_raw()) == raw
    assert fake.requests[0].header("accept-encoding") == "gzip"


def test_compressed_chat_answer_is_relayed_raw(fake, proxy):
    body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "z"}}]})
    raw = gzip.compress(body.encode())
    fake.script.append(Reply.raw(raw, headers={"content-encoding": "gzip"}))
    response = httpx.post(
        proxy.url + "/v1/chat/completions",
        json={"model": "m", "messages": []},
        headers={"accept-encoding": "gzip"},
    )
    assert response.json()["choices"][0]["message"]["content"] == "z"


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
def test_upstream_url_with_or_without_v1(fake, fake_url, make_proxy, suffix):
    proxy = make_proxy(upstream_url=fake_url + suffix)
    httpx.get(proxy.url + "/v1/models")
    httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert [r.path for r in fake.requests] == ["/v1/models", "/v1/chat/completions"]


def test_health_and_readiness(fake, proxy, make_proxy):
    assert httpx.get(proxy.url + "/memrelay/healthz").json() == {"status": "ok"}
    ready = httpx.get(proxy.url + "/memrelay/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    dead = make_proxy(upstream_url="http://127.0.0.1:9/v1", connect_timeout=0.5)
    assert httpx.get(dead.url + "/memrelay/readyz").status_code == 503
    assert httpx.get(dead.url + "/memrelay/healthz").status_code == 200
