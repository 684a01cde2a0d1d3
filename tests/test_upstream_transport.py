"""The upstream client's two engines (aiohttp, the default, and httpx's own) behave alike.

The upstream is tests/raw_upstream.py, a raw-socket HTTP/1.1 server on loopback that
records request bytes and misbehaves on cue. memrelay is served for real in front of it;
the client is httpx reading raw bytes. Every test runs under both transports.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import os
import socket
import ssl
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.relay.aiohttp_transport import RelayAiohttpTransport
from proxy.relay.upstream import Upstream
from proxy.settings import Settings
from tests.raw_upstream import (
    RawRequest,
    RawUpstream,
    answer,
    chunked,
    close_after_request,
    http_response,
    reset_after,
    then_wait,
)
from tests.servers import ServedApp, free_port

TRANSPORTS = ["aiohttp", "httpx"]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def up() -> Iterator[RawUpstream]:
    with RawUpstream() as upstream:
        yield upstream


@pytest.fixture(params=TRANSPORTS)
def transport(request: Any) -> str:
    return request.param


@pytest.fixture
def start_relay(up: RawUpstream) -> Iterator[Callable[..., ServedApp]]:
    started: list[ServedApp] = []

    def start(transport: str, **overrides: Any) -> ServedApp:
        overrides.setdefault("upstream_url", up.url + "/v1")
        overrides.setdefault("retries", 0)
        served = ServedApp(create_app(Settings(upstream_transport=transport, **overrides)))
        served.__enter__()
        started.append(served)
        return served

    yield start
    for served in started:
        served.__exit__(None, None, None)


@pytest.fixture
def relay(start_relay: Callable[..., ServedApp], transport: str) -> ServedApp:
    return start_relay(transport)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=20) as c:
        yield c


def fetch(client: httpx.Client, method: str, url: str, **kw: Any) -> tuple[httpx.Response, bytes]:
    """The response and its body exactly as memrelay sent it (no decoding)."""
    with client.stream(method, url, **kw) as response:
        return response, b"".join(response.iter_raw())


def until(check: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


# -- the request, on the wire ------------------------------------------------------------


def _send_request_set(client: httpx.Client, base: str) -> None:
    big = bytes(range(256)) * 4112  # past the pass-through buffer: streamed upstream

    def parts() -> Iterator[bytes]:  # no length, past the buffer: chunked upstream
        yield b"a" * 700_000
        yield b"b" * 700_000

    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/chat/completions", {"json": CHAT, "headers": {"Authorization": "Bearer k"}}),
        ("POST", "/v1/files", {"content": b"no type"}),
        ("DELETE", "/v1/files/a%2Fb%7Ec", {}),
        ("GET", "/v1/models", {"params": {"q": "a b+c/é"}}),
        ("POST", "/v1/uploads", {"content": big, "headers": {"Content-Type": "app/x"}}),
        ("POST", "/v1/uploads", {"content": parts()}),
        ("GET", "/v1/models", {"headers": [("X-Trace", "1"), ("x-trace", "2")]}),
        ("HEAD", "/v1/models", {}),
    ]
    for method, path, kw in calls:
        response, _ = fetch(client, method, base + path, **kw)
        assert response.status_code == 200, (method, path)


def test_the_upstream_receives_the_same_bytes_from_either_transport(
    up: RawUpstream, start_relay: Callable[..., ServedApp], client: httpx.Client
) -> None:
    seen: dict[str, list[RawRequest]] = {}
    for transport in TRANSPORTS:
        up.requests.clear()
        _send_request_set(client, start_relay(transport).url)
        seen[transport] = list(up.requests)
    aio, plain = seen["aiohttp"], seen["httpx"]
    assert [r.head for r in aio] == [r.head for r in plain]
    assert [r.body for r in aio] == [r.body for r in plain]
    chat, no_type, delete, query, big, parts, dup, head = aio
    assert [r.raw_body for r in aio if r is not parts] == [
        r.raw_body for r in plain if r.head != parts.head
    ]
    assert chat.header(b"content-type") == [b"application/json"]
    assert chat.header(b"accept-encoding") == [b"identity"]
    assert no_type.header(b"content-type") == []  # aiohttp would add application/octet-stream
    assert delete.head.startswith(b"DELETE /v1/files/")
    assert delete.header(b"content-length") == []  # aiohttp would add `Content-Length: 0`
    assert query.head.startswith(b"GET /v1/models?q=a+b%2Bc%2F%C3%A9 HTTP/1.1\r\n")  # as sent
    assert big.header(b"content-length") == [str(len(big.body)).encode()]
    assert big.header(b"transfer-encoding") == []
    assert parts.header(b"transfer-encoding") == [b"chunked"]
    assert parts.body == b"a" * 700_000 + b"b" * 700_000
    assert dup.header(b"x-trace") == [b"1", b"2"]
    assert head.head.startswith(b"HEAD ")


def test_a_body_under_expect_100_continue_is_sent_at_once(
    up: RawUpstream, start_relay: Callable[..., ServedApp], transport: str, client: httpx.Client
) -> None:
    """httpx never waits for `100 Continue`; an upstream that does not send one (it reads
    the body first) must not leave the request hanging until the first-byte timeout."""
    relay = start_relay(transport, first_byte_timeout=3)
    response = client.post(
        relay.url + "/v1/files", content=b"x" * 5000, headers={"Expect": "100-continue"}
    )
    assert response.status_code == 200
    assert up.requests[0].header(b"expect") == [b"100-continue"]
    assert up.requests[0].body == b"x" * 5000


# -- the response, byte for byte ---------------------------------------------------------


def test_encoded_and_framed_bodies_reach_the_client_byte_for_byte(
    up: RawUpstream, relay: ServedApp, client: httpx.Client
) -> None:
    text = b'{"answer": "' + b"memory " * 2000 + b'"}'
    gz = gzip.compress(text)
    brotli_like = os.urandom(3000)  # relayed, never decoded: any bytes will do
    large = os.urandom(6 * 1024 * 1024)
    json_type = (b"Content-Type", b"application/json")
    up.script.extend(
        [
            answer(http_response(headers=[json_type, (b"Content-Encoding", b"gzip")], body=gz)),
            answer(
                http_response(
                    headers=[
                        json_type,
                        (b"Content-Encoding", b"br"),
                        (b"Transfer-Encoding", b"chunked"),
                    ],
                    body=chunked(brotli_like[:1000], brotli_like[1000:]),
                    length=False,
                )
            ),
            answer(
                http_response(
                    headers=[json_type, (b"Connection", b"close")], body=text, length=False
                ),
                keep=False,
            ),
            answer(
                http_response(headers=[(b"Content-Type", b"application/octet-stream")], body=large)
            ),
        ]
    )
    expected = [(gz, "gzip"), (brotli_like, "br"), (text, None), (large, None)]
    for body, encoding in expected:
        response, got = fetch(client, "GET", relay.url + "/v1/files/x/content")
        assert response.status_code == 200
        assert response.headers.get("content-encoding") == encoding
        assert got == body


def test_head_204_304_and_repeated_headers_pass_through(
    up: RawUpstream, relay: ServedApp, client: httpx.Client
) -> None:
    up.script.extend(
        [
            answer(http_response(headers=[(b"Content-Length", b"1234")], length=False)),
            answer(http_response(204, reason=b"No Content", length=False)),
            answer(http_response(304, [(b"ETag", b'"v1"')], reason=b"Not Modified", length=False)),
            answer(
                http_response(
                    headers=[
                        (b"Set-Cookie", b"a=1; Path=/"),
                        (b"set-cookie", b"b=2; Path=/"),
                        (b"X-Request-ID", b"r1"),
                    ],
                    body=b"{}",
                )
            ),
        ]
    )
    response, body = fetch(client, "HEAD", relay.url + "/v1/models")
    assert (response.status_code, response.headers["content-length"], body) == (200, "1234", b"")
    response, body = fetch(client, "DELETE", relay.url + "/v1/models/x")
    assert (response.status_code, body) == (204, b"")
    response, body = fetch(
        client, "GET", relay.url + "/v1/models", headers={"If-None-Match": '"v1"'}
    )
    assert (response.status_code, response.headers["etag"], body) == (304, '"v1"', b"")
    response, body = fetch(client, "GET", relay.url + "/v1/models")
    assert response.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
    assert response.headers["x-request-id"] == "r1" and body == b"{}"


def test_response_heads_as_large_as_httpx_accepts_pass(
    up: RawUpstream, relay: ServedApp, client: httpx.Client
) -> None:
    """aiohttp's defaults stop at an 8 KiB header line and 128 fields; h11's at 16 KiB."""
    many = [(b"X-N-%d" % i, b"v") for i in range(150)]
    up.script.append(answer(http_response(headers=[(b"X-Big", b"x" * 10_000), *many], body=b"{}")))
    response, body = fetch(client, "GET", relay.url + "/v1/models")
    assert response.status_code == 200 and body == b"{}"
    assert response.headers["x-big"] == "x" * 10_000 and response.headers["x-n-149"] == "v"


def test_repeated_request_headers_differing_in_case_are_both_sent(
    up: RawUpstream, transport: str
) -> None:
    upstream = Upstream(Settings(upstream_url=up.url, upstream_transport=transport))

    async def call() -> None:
        headers = [(b"X-Trace", b"1"), (b"x-trace", b"2")]
        response = await upstream.open("GET", "/v1/models", b"", headers, None)
        await response.aread()
        await response.aclose()
        await upstream.aclose()

    asyncio.run(call())
    assert up.requests[0].header(b"x-trace") == [b"1", b"2"]


def test_a_stream_is_relayed_as_it_comes_not_buffered(
    up: RawUpstream, relay: ServedApp, client: httpx.Client
) -> None:
    first, last = b'data: {"n": 1}\n\n', b"data: [DONE]\n\n"
    release = threading.Event()
    sse = [(b"Content-Type", b"text/event-stream"), (b"Transfer-Encoding", b"chunked")]
    up.script.append(
        then_wait(
            http_response(headers=sse, body=chunked(first, end=False), length=False),
            release,
            chunked(last),
        )
    )
    got = b""
    with client.stream("POST", relay.url + "/v1/chat/completions", json=CHAT) as response:
        chunks = response.iter_raw()
        while len(got) < len(first):  # arrives while the upstream still holds the rest back
            got += next(chunks)
        release.set()
        got += b"".join(chunks)
    assert got == first + last


# -- failures map to the same answers -----------------------------------------------------


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_an_upstream_closing_after_the_request_is_a_502_sent_once(
    up: RawUpstream, relay: ServedApp, client: httpx.Client
) -> None:
    """httpx_aiohttp as shipped maps this ServerDisconnectedError to ConnectTimeout: a 504."""
    up.script.append(close_after_request)
    response = client.post(relay.url + "/v1/chat/completions", json=CHAT)
    assert _error(response) == (502, "upstream_unreachable")
    assert "disconnected" in response.json()["error"]["message"].lower()
    up.script.append(close_after_request)
    response = client.get(relay.url + "/v1/models")  # idempotent: aiohttp would resend it
    assert _error(response) == (502, "upstream_unreachable")
    assert len(up.requests) == 2


def test_a_reset_mid_head_is_a_502(up: RawUpstream, relay: ServedApp, client: httpx.Client) -> None:
    up.script.append(reset_after(b"HTTP/1.1 200 OK\r\nContent-Ty"))
    response = client.post(relay.url + "/v1/chat/completions", json=CHAT)
    assert _error(response) == (502, "upstream_unreachable")


def test_a_refused_connection_is_a_502_after_the_retries(
    start_relay: Callable[..., ServedApp], transport: str, client: httpx.Client
) -> None:
    relay = start_relay(transport, upstream_url=f"http://127.0.0.1:{free_port()}", retries=1)
    response = client.post(relay.url + "/v1/chat/completions", json=CHAT)
    assert _error(response) == (502, "upstream_unreachable")
    assert "could not reach the upstream" in response.json()["error"]["message"]


def test_a_connect_that_never_completes_is_a_504(
    start_relay: Callable[..., ServedApp], transport: str, client: httpx.Client
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):  # fills the accept queue
            relay = start_relay(
                transport, upstream_url=f"http://127.0.0.1:{port}", connect_timeout=0.3
            )
            response = client.post(relay.url + "/v1/chat/completions", json=CHAT)
    assert _error(response) == (504, "upstream_timeout")
    assert "timed out connecting" in response.json()["error"]["message"]


def test_a_silent_upstream_is_a_504_at_the_first_byte_timeout(
    up: RawUpstream, start_relay: Callable[..., ServedApp], transport: str, client: httpx.Client
) -> None:
    release = threading.Event()
    up.script.append(then_wait(b"", release))
    relay = start_relay(transport, first_byte_timeout=0.5)
    try:
        response = client.post(relay.url + "/v1/chat/completions", json=CHAT)
    finally:
        release.set()
    assert _error(response) == (504, "upstream_timeout")
    assert "did not answer in time" in response.json()["error"]["message"]


def test_a_head_trickled_past_the_first_byte_timeout_is_a_504(
    up: RawUpstream, start_relay: Callable[..., ServedApp], transport: str, client: httpx.Client
) -> None:
    """A byte of response head every 0.1 s never trips a per-read timeout; the first-byte
    timeout still caps the wait for the whole head."""

    async def trickle(reader: Any, writer: asyncio.StreamWriter, req: Any) -> bool:
        try:
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 60:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
        except OSError:
            pass
        return False

    up.script.append(trickle)
    relay = start_relay(transport, first_byte_timeout=0.5)
    started = time.monotonic()
    response = client.post(relay.url + "/v1/chat/completions", json=CHAT)
    assert _error(response) == (504, "upstream_timeout")
    assert time.monotonic() - started < 2.5


def test_a_stream_that_stalls_past_the_read_timeout_is_cut_for_the_client(
    up: RawUpstream, start_relay: Callable[..., ServedApp], transport: str, client: httpx.Client
) -> None:
    release = threading.Event()
    sse = [(b"Content-Type", b"text/event-stream"), (b"Transfer-Encoding", b"chunked")]
    event = b'data: {"n": 1}\n\n'
    up.script.append(
        then_wait(http_response(headers=sse, body=chunked(event, end=False), length=False), release)
    )
    relay = start_relay(transport, first_byte_timeout=0.5)
    got = b""
    try:
        with pytest.raises(httpx.RemoteProtocolError):  # an incomplete chunked body
            with client.stream("POST", relay.url + "/v1/chat/completions", json=CHAT) as response:
                for chunk in response.iter_raw():
                    got += chunk
    finally:
        release.set()
    assert got == event


@pytest.mark.parametrize("cut", ["chunked", "content-length"])
def test_a_body_cut_mid_way_reaches_the_client_as_a_cut(
    up: RawUpstream, relay: ServedApp, client: httpx.Client, cut: str
) -> None:
    event = b'data: {"n": 1}\n\n'
    if cut == "chunked":
        head = [(b"Content-Type", b"text/event-stream"), (b"Transfer-Encoding", b"chunked")]
        raw = http_response(headers=head, body=chunked(event, end=False), length=False)
    else:
        head = [(b"Content-Type", b"text/event-stream"), (b"Content-Length", b"1000")]
        raw = http_response(headers=head, body=event, length=False)
    up.script.append(answer(raw, keep=False))
    got = b""
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", relay.url + "/v1/chat/completions", json=CHAT) as response:
            assert response.status_code == 200
            for chunk in response.iter_raw():
                got += chunk
    assert got == event


def test_an_upstream_certificate_nobody_vouches_for_is_refused(
    start_relay: Callable[..., ServedApp], transport: str, client: httpx.Client, tmp_path: Any
) -> None:
    """TLS is verified under both engines: a self-signed upstream is a 502, never served."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    with RawUpstream(tls) as up:
        relay = start_relay(transport, upstream_url=f"https://localhost:{up.port}/v1")
        response = client.post(relay.url + "/v1/chat/completions", json=CHAT)
    assert _error(response) == (502, "upstream_unreachable")
    assert "CERTIFICATE_VERIFY_FAILED" in response.json()["error"]["message"]
    assert up.requests == []


# -- the pool ------------------------------------------------------------------------------


def test_connections_are_kept_alive_and_reused(
    up: RawUpstream, relay: ServedApp, client: httpx.Client
) -> None:
    for _ in range(3):
        assert client.post(relay.url + "/v1/chat/completions", json=CHAT).status_code == 200
    assert [r.connection for r in up.requests] == [1, 1, 1]


def test_a_connection_closed_while_the_loop_was_busy_is_not_reused(
    up: RawUpstream, transport: str
) -> None:
    """The upstream closes an idle connection while the relay's loop is busy (a loaded
    relay): the FIN is on the socket, but no callback has run for it yet. aiohttp alone
    would send the next request there and get "Server disconnected" (a 502); the socket
    is polled before reuse, as httpcore does."""
    upstream = Upstream(Settings(upstream_url=up.url, upstream_transport=transport, retries=0))
    body = http_response(headers=[(b"Content-Type", b"application/json")], body=b"{}")
    up.script.extend([answer(body, keep=False), answer(body)])

    async def twice() -> list[int]:
        statuses = []
        try:
            for _ in range(2):
                response = await upstream.open("POST", "/v1/chat/completions", b"", [], b"{}")
                await response.aread()
                await response.aclose()
                statuses.append(response.status_code)
                until(lambda: up.closed == 1)  # blocks the loop, as a burst of work would
                time.sleep(0.05)  # noqa: ASYNC251 - the FIN crosses loopback, loop still busy
        finally:
            await upstream.aclose()
        return statuses

    assert asyncio.run(twice()) == [200, 200]
    assert [r.connection for r in up.requests] == [1, 2]


def test_an_idle_connection_the_upstream_closed_is_not_reused(
    up: RawUpstream, relay: ServedApp, client: httpx.Client
) -> None:
    assert client.post(relay.url + "/v1/chat/completions", json=CHAT).status_code == 200
    until(lambda: up.open_now == 1)
    _close_idle(up)  # as the upstream's keep-alive timeout would
    until(lambda: up.open_now == 0)
    response = client.post(relay.url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert [r.connection for r in up.requests] == [1, 2]


def _close_idle(up: RawUpstream) -> None:
    """Shut every idle connection of the fake upstream down (its keep-alive expiring)."""

    async def shut() -> None:
        for task in asyncio.all_tasks():
            if task.get_coro().__qualname__.startswith("RawUpstream._serve"):  # type: ignore[union-attr]
                task.cancel()

    asyncio.run_coroutine_threadsafe(shut(), up.loop).result(5)


def test_the_pool_limit_counts_every_connection(
    up: RawUpstream, start_relay: Callable[..., ServedApp], transport: str
) -> None:
    release = threading.Event()
    body = http_response(headers=[(b"Content-Type", b"application/json")], body=b"{}")

    async def held(reader: Any, writer: asyncio.StreamWriter, req: RawRequest) -> bool:
        await asyncio.to_thread(release.wait, 30)
        writer.write(body)
        await writer.drain()
        return True

    up.script.extend([held] * 4)
    relay = start_relay(transport, pool_connections=2)

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=20) as c:
            calls = [c.post(relay.url + "/v1/chat/completions", json=CHAT) for _ in range(4)]
            tasks = [asyncio.ensure_future(call) for call in calls]
            await asyncio.to_thread(until, lambda: len(up.requests) >= 2)
            await asyncio.sleep(0.2)  # a third connection would have been opened by now
            opened = up.connections
            release.set()
            return [opened] + [(await t).status_code for t in tasks]

    opened, *statuses = asyncio.run(run())
    assert opened == 2 and up.peak == 2
    assert statuses == [200] * 4


# -- state the shared client must not keep --------------------------------------------------


def test_waiting_for_a_pooled_connection_past_the_timeout_is_a_504(
    up: RawUpstream, start_relay: Callable[..., ServedApp], transport: str
) -> None:
    release = threading.Event()
    up.script.append(then_wait(b"", release, http_response(body=b"{}")))
    relay = start_relay(transport, pool_connections=1, connect_timeout=0.3)

    async def run() -> tuple[int, tuple[int, str]]:
        async with httpx.AsyncClient(timeout=20) as c:
            url = relay.url + "/v1/chat/completions"
            first = asyncio.ensure_future(c.post(url, json=CHAT))
            await asyncio.to_thread(until, lambda: len(up.requests) == 1)
            second = await c.post(url, json=CHAT)  # no connection frees up in time
            release.set()
            return (await first).status_code, _error(second)

    assert asyncio.run(run()) == (200, (504, "upstream_timeout"))
    assert len(up.requests) == 1


def test_an_upstream_cookie_never_rides_on_a_later_request(
    up: RawUpstream, start_relay: Callable[..., ServedApp], transport: str, client: httpx.Client
) -> None:
    """The client serves every tenant: httpx's default jar (and aiohttp's) would send
    tenant A's session cookie on tenant B's next request. (A host name: aiohttp's jar
    ignores cookies from IP addresses.)"""
    relay = start_relay(transport, upstream_url=f"http://localhost:{up.port}/v1")
    up.script.append(
        answer(http_response(headers=[(b"Set-Cookie", b"session=tenant-a; Path=/")], body=b"{}"))
    )
    client.post(relay.url + "/v1/chat/completions", json=CHAT, headers={"X-Memrelay-Tenant": "a"})
    client.cookies.clear()
    client.post(relay.url + "/v1/chat/completions", json=CHAT, headers={"X-Memrelay-Tenant": "b"})
    assert [r.header(b"cookie") for r in up.requests] == [[], []]


def test_sessions_are_made_in_their_loop_and_closed_with_the_upstream(up: RawUpstream) -> None:
    upstream = Upstream(Settings(upstream_url=up.url, upstream_transport="aiohttp"))
    transport = upstream.client._transport
    assert isinstance(transport, RelayAiohttpTransport)
    assert transport._sessions == {}  # nothing is made outside a running loop
    made = []

    async def call() -> None:
        response = await upstream.open("GET", "/v1/models", b"", [], None)
        await response.aread()
        await response.aclose()
        made.append(transport.session())
        assert made[-1]._loop is asyncio.get_running_loop()

    async def call_and_close() -> None:
        await call()
        await upstream.aclose()

    asyncio.run(call())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(call_and_close())  # another loop: another session, and closed
        gc.collect()
    assert made[0] is not made[1]  # the first loop's was dropped with its loop
    assert all(session.closed for session in made)
    assert transport._sessions == {}
    assert not [w for w in caught if "Unclosed client session" in str(w.message)]
