"""The edge: one identity decision per request, canonical paths, an explicit pass-through
list, and a clear JSON 4xx (string code) for every bad input, with nothing half-written."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from proxy.app import create_app
from proxy.edge.identity import IdentityMissing, identity_of
from proxy.edge.keys import KeyStore
from proxy.settings import Settings
from tests.servers import ServedApp

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert isinstance(error["code"], str) and error["message"]
    return error


# -- one decision, structurally ---------------------------------------------------------


def test_a_new_route_cannot_read_raw_memrelay_headers(fake_url, tmp_path):
    """A route added later sees no X-Memrelay-* header at all, only the edge's Identity."""
    keys = KeyStore(tmp_path / "keys.json")
    alice, _ = keys.create(["alice"])

    async def careless(request: Request) -> JSONResponse:
        raw = {k: v for k, v in request.headers.items() if k.startswith("x-memrelay-")}
        return JSONResponse({"raw": raw, "tenant": identity_of(request.scope).tenant})

    app = create_app(
        Settings(upstream_url=fake_url, keys_file=tmp_path / "keys.json"),
        routes=[Route("/memrelay/v1/careless", careless, methods=["GET"])],
        keys=keys,
    )
    with ServedApp(app) as served:
        got = httpx.get(
            served.url + "/memrelay/v1/careless",
            headers={"X-Memrelay-Key": alice, "X-Memrelay-Tenant": "alice"},
        )
        assert got.json() == {"raw": {}, "tenant": "alice"}
        twice = httpx.get(
            served.url + "/memrelay/v1/careless",
            headers=[
                ("X-Memrelay-Key", alice),
                ("X-Memrelay-Tenant", "alice"),
                ("x-memrelay-tenant", "bob"),
            ],
        )
        assert _error(twice, 400)["code"] == "repeated_header"


def test_identity_accessor_refuses_a_scope_the_edge_never_saw():
    with pytest.raises(IdentityMissing):
        identity_of({"type": "http", "headers": [(b"x-memrelay-tenant", b"bob")]})
    with pytest.raises(IdentityMissing):
        identity_of({"type": "http", "state": {}})


def test_no_module_but_the_edge_reads_memrelay_request_headers():
    """Only proxy/edge/identity.py names the X-Memrelay-* request headers it parses (this
    scan flags today's main: auth.py, scoping.py)."""
    # A string that is exactly one of those header names: the way code reads a header.
    pattern = re.compile(
        r"""b?["']x-memrelay-(key|tenant|write-space|read-spaces|memory)["']""", re.I
    )
    offenders = []
    for path in sorted(Path("proxy").glob("*.py")) + sorted(Path("memory_core").glob("*.py")):
        if path.name in ("identity.py", "openapi.py", "chat_client.py"):
            continue  # the parser; the documentation; a client that sends them
        text = path.read_text()
        code = re.sub(r'"""[\s\S]*?"""', "", text)  # docstrings may name them
        for line in code.splitlines():
            if pattern.search(line) and not line.strip().startswith("#"):
                offenders.append(f"{path}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize(
    "headers",
    [
        [("X-Memrelay-Tenant", "acme"), ("X-MEMRELAY-TENANT", "beta")],
        [("X-Memrelay-Read-Spaces", "a"), ("x-memrelay-read-spaces", "b")],
        [("X-Memrelay-Write-Space", "a"), ("X-Memrelay-Write-Space", "a")],
        [("X-Memrelay-Memory", "on"), ("X-Memrelay-Memory", "off")],
        [("Authorization", "Bearer a"), ("authorization", "Bearer b")],
        [("X-Memrelay-Tenants", "acme")],  # a typo would silently mean "default"
    ],
)
def test_repeated_or_unknown_memrelay_headers_are_400(fake, proxy, headers):
    for path in ("/v1/chat/completions", "/v1/models", "/memrelay/healthz"):
        method = "POST" if path.endswith("completions") else "GET"
        response = httpx.request(method, proxy.url + path, headers=headers, json=CHAT)
        assert _error(response, 400)["code"] in ("repeated_header", "unknown_memrelay_header")
    assert fake.requests == []


def test_repeated_key_is_400_even_when_both_are_valid(fake, memory_proxy, tmp_path):
    keys = KeyStore(tmp_path / "keys.json")
    a, _ = keys.create(["acme"])
    b, _ = keys.create(["beta"])
    server, _ = memory_proxy(keys_file=tmp_path / "keys.json")
    response = httpx.get(
        server.url + "/memrelay/v1/memories",
        headers=[("X-Memrelay-Key", a), ("X-Memrelay-Key", b), ("X-Memrelay-Tenant", "beta")],
    )
    assert _error(response, 400)["param"] == "X-Memrelay-Key"


# -- every path needs a key; only the list passes through -----------------------------


@pytest.fixture
def keyed_proxy(make_proxy, tmp_path):
    def start(**overrides):
        keys = KeyStore(tmp_path / "keys.json")
        key, _ = keys.create(["acme"])
        served = make_proxy(keys_file=tmp_path / "keys.json", **overrides)
        return served, key

    return start


def _raw(url: str, method: str, raw_path: str, headers: dict[str, str]) -> httpx.Response:
    target = httpx.URL(url).copy_with(raw_path=raw_path.encode())
    return httpx.request(method, target, headers=headers, json=CHAT)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "//v1/chat/completions"),
        ("POST", "/v1/./chat/completions"),
        ("POST", "/v1%2Fchat/completions"),
        ("POST", "/v1/chat/completions."),
        ("POST", "/x/../v1/chat/completions"),
        ("POST", "/chat/completions"),
        ("POST", "/completion"),
        ("GET", "/slots"),
        ("GET", "/props"),
        ("GET", "/health"),
        ("GET", "/metrics"),
        ("GET", "/"),
        ("GET", "/memrelay/v1/memories"),
        ("GET", "/memrelay/openapi.json"),
    ],
)
def test_every_path_needs_a_key(fake, keyed_proxy, method, path):
    served, _ = keyed_proxy()
    response = _raw(served.url, method, path, {"Authorization": "Bearer sk-up"})
    assert _error(response, 401)["code"] == "invalid_memrelay_key"
    assert fake.requests == []


def test_probes_stay_open_for_health_checks(fake, keyed_proxy):
    served, _ = keyed_proxy()
    assert httpx.get(served.url + "/memrelay/healthz").status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "//v1/chat/completions",
        "/v1/./chat/completions",
        "/v1%2Fchat/completions",
        "/v1/chat/completions.",
    ],
)
def test_path_tricks_reach_chat_with_memory_not_a_bare_forward(fake, memory_proxy, tmp_path, path):
    keys = KeyStore(tmp_path / "keys.json")
    key, _ = keys.create(["acme"])
    server, seed = memory_proxy(keys_file=tmp_path / "keys.json", recall_budget_ms=10_000)
    seed.add("acme", "default", "Acme's launch is on May 5")
    response = _raw(server.url, "POST", path, {"X-Memrelay-Key": key, "X-Memrelay-Tenant": "acme"})
    assert response.status_code == 200
    sent = fake.chat_requests()[-1]
    assert sent.path == "/v1/chat/completions"
    assert "May 5" in sent.json()["messages"][0]["content"]  # the chat route ran, with memory
    assert response.headers["x-memrelay-recall-status"] == "ok"


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/chat/completions"), ("POST", "/completion"), ("GET", "/slots"), ("GET", "/")],
)
def test_outside_the_list_is_a_json_404_never_forwarded(fake, keyed_proxy, method, path):
    served, key = keyed_proxy()
    response = _raw(served.url, method, path, {"X-Memrelay-Key": key})
    assert _error(response, 404)["code"] == "route_not_found"
    assert fake.requests == []


def test_extras_pass_only_when_a_setting_names_them(fake, keyed_proxy):
    served, key = keyed_proxy(passthrough_extra_paths="/health,/slots")
    for path in ("/health", "/slots", "/slots/0"):
        assert httpx.get(served.url + path, headers={"X-Memrelay-Key": key}).status_code == 200
    assert fake.requests[-1].path == "/slots/0"
    assert httpx.get(served.url + "/props", headers={"X-Memrelay-Key": key}).status_code == 404
    with pytest.raises(ValueError):
        Settings(passthrough_extra_paths="/memrelay/v1")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("TRACE", "/memrelay/v1/memories", 405),
        ("PUT", "/memrelay/v1/memories", 405),
        ("POST", "/memrelay/v1/memory", 404),
        ("GET", "/memrelay/v2/anything", 404),
        ("DELETE", "/memrelay/healthz", 405),
    ],
)
def test_unknown_memrelay_paths_and_methods_are_never_forwarded(
    fake, memory_proxy, method, path, status
):
    server, _ = memory_proxy()
    response = httpx.request(
        method, server.url + path, headers={"Authorization": "Bearer sk-client"}, content=b"{}"
    )
    _error(response, status)
    assert fake.requests == []


# -- bad input: a clear 4xx, nothing written --------------------------------------------


@pytest.fixture
def admin(memory_proxy):
    server, seed = memory_proxy()
    client = httpx.Client(
        base_url=server.url + "/memrelay/v1", timeout=30, headers={"X-Memrelay-Tenant": "acme"}
    )
    yield server, client, seed
    client.close()


@pytest.mark.parametrize(
    "raw",
    [
        b'{"content": "Mars trip in spring", "expires_at": 1e999}',
        b'{"content": "Mars trip in spring", "expires_at": Infinity}',
        b'{"content": "Mars trip in spring", "expires_at": NaN}',
        b'{"content": "Mars trip in spring", "confidence": -Infinity}',
    ],
)
def test_non_finite_numbers_are_refused_before_anything_is_written(admin, raw):
    _server, client, _ = admin
    response = client.post("/memories", content=raw, headers={"content-type": "application/json"})
    assert _error(response, 400)["code"] == "invalid_json"
    assert client.get("/memories").json()["data"] == []
    assert client.get("/events", params={"since": 0}).json()["data"] == []
    assert "Mars" not in client.get("/export").text


@pytest.mark.parametrize("path", ["/memories", "/recall", "/forget"])
def test_deep_nesting_on_admin_routes_is_a_400(admin, path):
    _, client, _ = admin
    deep = b'{"query": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = client.post(path, content=deep, headers={"content-type": "application/json"})
    assert _error(response, 400)["code"] == "invalid_json"
    shallow_but_deep = {"query": json.loads("[" * 70 + "]" * 70)}
    assert client.post(path, json=shallow_but_deep).status_code == 400


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi", "tool_calls": 5}],
        [{"role": "assistant", "content": None, "tool_calls": [{"function": "f"}]}],
        [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": 5}}]}],
        [{"role": "assistant", "tool_calls": ["call"]}],
        [{"role": "assistant", "function_call": "f"}],
        [{"role": 7, "content": "hi"}],
        [{"role": "user", "content": 5}],
        ["hello"],
        "hello",
    ],
)
def test_malformed_chat_shapes_are_a_400(fake, memory_proxy, messages):
    server, _ = memory_proxy()
    response = httpx.post(
        server.url + "/v1/chat/completions", json={"model": "m", "messages": messages}
    )
    assert _error(response, 400)["code"] == "invalid_body"
    assert fake.requests == []


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model": "m", "temperature": 1e999, "messages": []}',
        b'{"model": "m", "temperature": NaN, "messages": []}',
    ],
)
def test_deep_or_non_finite_chat_is_a_400(fake, memory_proxy, raw):
    server, _ = memory_proxy()
    response = httpx.post(
        server.url + "/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert _error(response, 400)["code"] == "invalid_body"
    assert fake.requests == []


@pytest.mark.parametrize(
    "params",
    [
        {"cursor": "999999999999999999999999999999"},
        {"cursor": "-1"},
        {"cursor": "١٢"},  # digits, but not ASCII ones
    ],
)
def test_cursor_out_of_range_is_a_400(admin, params):
    _, client, _ = admin
    assert _error(client.get("/memories", params=params), 400)["code"] == "invalid_request"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
def test_non_finite_query_numbers_are_a_422(admin, value):
    _, client, _ = admin
    response = client.get("/memories", params={"created_after": value})
    assert _error(response, 422)["code"] == "validation_error"


def test_admin_errors_use_string_codes(admin):
    _, client, _ = admin
    assert _error(client.get("/memories/mem_nope"), 404)["code"] == "not_found"
    assert _error(client.post("/memories", json={}), 422)["code"] == "validation_error"
    assert _error(client.post("/memories", content=b"{oops"), 400)["code"] == "invalid_json"


def _send_raw(port: int, head: bytes, body: bytes) -> bytes:
    """Send a request head and part of a body, then read what comes back, without ever
    sending the rest: an early answer proves the server did not wait for the body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR) if not body else None
        return sock.recv(65536)


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/memrelay/v1/memories", "/memrelay/v1/import"]
)
def test_declared_content_length_past_the_limit_is_413_before_the_body(fake, memory_proxy, path):
    server, _ = memory_proxy(import_max_bytes=10 * 1024 * 1024)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {100 * 1024 * 1024}\r\n\r\n"
    ).encode()
    answer = _send_raw(server.port, head, b"{" + b" " * 1024 * 1024)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"code": "body_too_large"' in answer
    assert fake.requests == []


def test_admin_body_and_import_caps_hold_for_streamed_bodies(memory_proxy):
    server, _ = memory_proxy(admin_max_body_bytes=4096, import_max_bytes=64 * 1024)
    client = httpx.Client(base_url=server.url + "/memrelay/v1", timeout=30)

    def chunks(total: int, line: bytes):
        sent = 0
        while sent < total:
            yield line
            sent += len(line)

    big = client.post("/recall", content=chunks(8192, b" " * 512))
    assert _error(big, 413)["code"] == "body_too_large"
    exported = client.post(
        "/memories", json={"content": "Imported row"}, headers={"X-Memrelay-Tenant": "src"}
    )
    assert exported.status_code == 201
    record = json.loads(client.get("/export", headers={"X-Memrelay-Tenant": "src"}).content)
    line = json.dumps({**record, "id": "mem_imported1"}).encode()
    refused = client.post(
        "/import",
        content=chunks(128 * 1024, line + b"\n"),
        headers={"content-type": "application/x-ndjson"},
    )
    assert _error(refused, 413)["code"] == "body_too_large"
    assert client.get("/memories").json()["data"] == []  # nothing half-imported (tenant default)
    ok = client.post(
        "/import", content=line + b"\n", headers={"content-type": "application/x-ndjson"}
    )
    assert ok.json()["imported"] == 1
    client.close()


def test_huge_headers_are_431_and_never_forwarded(fake, proxy):
    response = httpx.get(proxy.url + "/v1/models", headers={"X-Big": "a" * 40_000})
    assert _error(response, 431)["code"] == "headers_too_large"
    assert fake.requests == []


def test_a_full_disk_is_a_507_and_writes_nothing(fake, embedder, tmp_path, fake_url):
    """A real limit: SQLite's max_page_count on the server's own writer connection."""
    from memory_core import SQLiteStore
    from proxy.wiring import build_app

    store = SQLiteStore(tmp_path / "full.db", embedder)
    settings = Settings(upstream_url=fake_url, db=tmp_path / "full.db", extraction_workers=0)
    with ServedApp(build_app(settings, store=store)) as served:
        client = httpx.Client(
            base_url=served.url + "/memrelay/v1", headers={"X-Memrelay-Tenant": "acme"}
        )
        assert client.post("/memories", json={"content": "First fact fits"}).status_code == 201

        def cap(conn):
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")

        store._writer.run_sync(cap)  # the one connection every write goes through
        content = "The user's new passport number " + "x" * 7_000
        response = client.post("/memories", json={"content": content})
        error = _error(response, 507)
        assert error["code"] == "storage_full" and "disk is full" in error["message"]
        contents = [m["content"] for m in client.get("/memories").json()["data"]]
        assert contents == ["First fact fits"]
        first = client.get("/memories").json()["data"][0]["id"]
        forget = client.delete(f"/memories/{first}")
        assert forget.status_code in (200, 507)
        if forget.status_code == 507:
            assert client.get(f"/memories/{first}").json()["status"] == "active"
        client.close()


# -- keys file ----------------------------------------------------------------------------


def test_revocation_by_editing_the_file_lands_within_a_second(fake, memory_proxy, tmp_path):
    path = tmp_path / "keys.json"
    keys = KeyStore(path)
    key, _record = keys.create(["acme"])
    server, _ = memory_proxy(keys_file=path)
    headers = {"X-Memrelay-Key": key, "X-Memrelay-Tenant": "acme"}
    assert httpx.get(server.url + "/memrelay/v1/memories", headers=headers).status_code == 200
    data = json.loads(path.read_text())
    data[0]["revoked"] = True
    path.write_text(json.dumps(data))  # a plain edit, as an operator would make it
    deadline = time.monotonic() + 1.0
    status = 200
    while time.monotonic() < deadline and status == 200:
        status = httpx.get(server.url + "/memrelay/v1/memories", headers=headers).status_code
    assert status == 401
    new_key, _ = KeyStore(path).create(["acme"])  # and a new key works without a restart
    deadline = time.monotonic() + 1.0
    status = 401
    while time.monotonic() < deadline and status == 401:
        status = httpx.get(
            server.url + "/memrelay/v1/memories",
            headers={"X-Memrelay-Key": new_key, "X-Memrelay-Tenant": "acme"},
        ).status_code
    assert status == 200


def test_a_keys_file_emptied_or_deleted_locks_rather_than_opens(fake, memory_proxy, tmp_path):
    path = tmp_path / "keys.json"
    KeyStore(path).create(["acme"])
    server, _ = memory_proxy(keys_file=path)
    path.unlink()
    time.sleep(0.6)
    response = httpx.get(server.url + "/memrelay/v1/memories", headers={"X-Memrelay-Tenant": "x"})
    assert response.status_code == 401


def test_a_missing_keys_file_is_an_error_at_start(tmp_path, fake_url):
    from memory_core import SQLiteStore  # noqa: F401  (the store is never opened)
    from proxy.edge.keys import KeysFileMissing
    from proxy.wiring import build_app

    missing = tmp_path / "nope.json"
    with pytest.raises(KeysFileMissing, match=str(missing)):
        build_app(Settings(upstream_url=fake_url, keys_file=missing, db=tmp_path / "m.db"))


def test_sighup_reloads_the_keys_file(tmp_path):
    """A real SIGHUP to this process, handled by the watcher the app's lifespan installs."""
    import asyncio
    import os
    import signal

    from proxy.app import watch_sighup

    path = tmp_path / "keys.json"
    key, _ = KeyStore(path).create(["acme"])
    keys = KeyStore(path, must_exist=True)
    assert keys.check(key) is not None
    other = KeyStore(path)
    other.revoke(other.records[0].id)

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        watch_sighup(keys)
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            for _ in range(100):
                await asyncio.sleep(0.01)
                if keys.records[0].revoked:
                    return True
            return False
        finally:
            loop.remove_signal_handler(signal.SIGHUP)

    assert asyncio.run(main()) is True


def test_log_lines_name_the_key_and_tenant_the_edge_decided(fake, memory_proxy, tmp_path):
    import io
    import logging

    from proxy.logs import JSONFormatter

    keys = KeyStore(tmp_path / "keys.json")
    key, record = keys.create(["acme"])
    server, _ = memory_proxy(keys_file=tmp_path / "keys.json")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    try:
        httpx.post(
            server.url + "/v1/chat/completions",
            headers={"X-Memrelay-Key": key, "X-Memrelay-Tenant": "acme"},
            json={"model": "m", "messages": [{"role": "user", "content": ""}]},
        )
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    mine = [line for line in lines if line["key_id"] == record.id]
    assert mine and all(line["tenant"] == "acme" for line in mine)
    assert key not in stream.getvalue()


def test_a_bearer_memrelay_key_is_never_forwarded_in_header_mode(fake, memory_proxy, tmp_path):
    """Without memrelay's own upstream key, Authorization belongs to the upstream: a memrelay
    key sent there is not accepted as one on forwarded routes (so it is never forwarded)."""
    keys = KeyStore(tmp_path / "keys.json")
    key, _ = keys.create(["acme"])
    server, _ = memory_proxy(keys_file=tmp_path / "keys.json")
    bearer = {"Authorization": f"Bearer {key}", "X-Memrelay-Tenant": "acme"}
    chat = httpx.post(server.url + "/v1/chat/completions", headers=bearer, json=CHAT)
    assert _error(chat, 401)["code"] == "invalid_memrelay_key"
    assert httpx.get(server.url + "/v1/models", headers=bearer).status_code == 401
    assert fake.requests == []
    assert httpx.get(server.url + "/memrelay/v1/memories", headers=bearer).status_code == 200


def test_metrics_count_a_path_trick_under_the_route_it_reached(fake, memory_proxy):
    server, _ = memory_proxy()
    response = _raw(server.url, "POST", "//v1/chat/completions", {})
    assert response.status_code == 200
    text = httpx.get(server.url + "/metrics").text
    assert (
        'memrelay_requests_total{method="POST",route="chat_completions",status="200"} 1.0' in text
    )
