"""Bad input, upstream failures, retries, timeouts and client disconnects."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import openai
import pytest

from tests.fake_upstream import Reply, chat_chunk


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body["error"]) >= {"message", "type", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("content", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"", 400, "empty"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"model": "m"}', 400, "messages"),
        (b'{"model": "m", "messages": "hi"}', 400, "messages"),
    ],
)
def test_bad_chat_input_is_rejected_before_upstream(fake, proxy, content, status, needle):
    response = httpx.post(
        proxy.url + "/v1/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == status
    assert needle in _error(response)["message"]
    assert fake.requests == []


def test_body_over_limit_is_413(fake, make_proxy):
    proxy = make_proxy(max_body_bytes=1000)
    big = '{"model": "m", "messages": [{"role": "user", "content": "' + "x" * 2000 + '"}]}'
    response = httpx.post(proxy.url + "/v1/chat/completions", content=big)
    assert response.status_code == 413
    assert _error(response)["code"] == "body_too_large"
    assert fake.requests == []


def test_sdk_sees_bad_request_error(fake, proxy):
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages="nope")  # type: ignore[arg-type]
    assert "messages" in str(info.value)


def test_connect_failure_is_502(make_proxy):
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    proxy = make_proxy(upstream_url=f"http://127.0.0.1:{dead_port}", retries=1)
    for path, kwargs in [
        ("/v1/chat/completions", {"json": {"model": "m", "messages": []}}),
        ("/v1/models", {}),
    ]:
        response = httpx.request("POST" if kwargs else "GET", proxy.url + path, **kwargs)
        assert response.status_code == 502
        assert _error(response)["code"] == "upstream_unreachable"


def test_upstream_timeout_is_504(fake, make_proxy):
    proxy = make_proxy(first_byte_timeout=0.3, retries=0)
    fake.script.append(Reply.hang())
    started = time.monotonic()
    response = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert response.status_code == 504
    assert _error(response)["code"] == "upstream_timeout"
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_retryable_statuses_are_retried(fake, make_proxy, status):
    proxy = make_proxy(retries=2)
    fake.script.append(
        Reply.json({"error": {"message": "busy"}}, status=status, headers={"retry-after": "0.05"})
    )
    response = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert response.status_code == 200
    assert len(fake.chat_requests()) == 2


def test_retries_are_bounded_and_last_error_passes_through(fake, make_proxy):
    proxy = make_proxy(retries=2)
    for _ in range(3):
        fake.script.append(
            Reply.json(
                {"error": {"message": "overloaded"}}, status=503, headers={"retry-after-ms": "10"}
            )
        )
    response = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert response.status_code == 503
    assert response.json() == {"error": {"message": "overloaded"}}
    assert len(fake.chat_requests()) == 3


def test_long_retry_after_is_not_waited_for(fake, make_proxy):
    proxy = make_proxy(retries=2, retry_max_wait=1)
    fake.script.append(
        Reply.json({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "120"})
    )
    started = time.monotonic()
    response = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert response.status_code == 429 and time.monotonic() - started < 2
    assert len(fake.chat_requests()) == 1


def test_non_retryable_status_is_not_retried(fake, make_proxy):
    proxy = make_proxy(retries=3)
    fake.script.append(Reply.json({"error": {"message": "nope"}}, status=500))
    assert (
        httpx.post(
            proxy.url + "/v1/chat/completions", json={"model": "m", "messages": []}
        ).status_code
        == 500
    )
    assert len(fake.chat_requests()) == 1


def test_no_retry_after_first_byte(fake, make_proxy):
    proxy = make_proxy(retries=3)
    fake.script.append(Reply.cut([chat_chunk({"role": "assistant", "content": "partial"})]))
    received = _stream_until_cut(proxy)
    assert b"partial" in received
    assert len(fake.chat_requests()) == 1


def _disconnect_after(url: str, json_body: dict, wait_for: threading.Event | None, read_some: bool):
    """Open a request on a raw socket and close it at the chosen moment."""
    host, port = url.removeprefix("http://").split(":")
    payload = httpx.Request("POST", url + "/v1/chat/completions", json=json_body)
    body = payload.read()
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    if read_some:
        data = b""
        while b"partial" not in data:
            data += sock.recv(65536)
    elif wait_for is not None:
        wait_for.wait(2)
    else:
        time.sleep(0.3)
    closed_at = time.monotonic()
    sock.close()
    return closed_at


@pytest.mark.parametrize("case", ["before_first_token", "mid_stream", "non_streaming"])
def test_client_disconnect_reaches_upstream_within_a_second(fake, proxy, case):
    if case == "mid_stream":
        chunks = [chat_chunk({"role": "assistant", "content": "partial"})]
        chunks += [chat_chunk({"content": "."}) for _ in range(300)]
        fake.script.append(Reply.sse(chunks, delay=0.02))
    else:
        fake.script.append(Reply.hang())
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "stream": case != "non_streaming",
    }
    closed_at = _disconnect_after(proxy.url, body, None, read_some=case == "mid_stream")
    assert fake.disconnected.wait(1.0), "the upstream never saw the client go away"
    assert fake.disconnected_at is not None and fake.disconnected_at - closed_at < 1.0


def test_total_timeout_cuts_a_stream_mid_way(fake, make_proxy):
    """Past `total_timeout` the client connection is aborted, so a cut answer never
    looks complete (no final empty chunk, no [DONE])."""
    proxy = make_proxy(total_timeout=0.6)
    chunks = [chat_chunk({"role": "assistant", "content": "partial"})]
    chunks += [chat_chunk({"content": "."}) for _ in range(40)] + [b"data: [DONE]\n\n"]
    fake.script.append(Reply.sse(chunks, delay=0.05))
    started = time.monotonic()
    received = _stream_until_cut(proxy)
    assert b"partial" in received and b"[DONE]" not in received
    assert 0.5 < time.monotonic() - started < 1.5


def test_client_gone_mid_upload_leaves_nothing_running(fake, proxy):
    """The chat handler reads the body itself: a client that leaves half way through its
    upload ends the request (nothing goes upstream) and the proxy serves the next one."""
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            b'{"model": "m", "messages": ['
        )
        time.sleep(0.2)
    time.sleep(0.2)
    response = httpx.post(
        proxy.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=3
    )
    assert response.status_code == 200
    assert len(fake.chat_requests()) == 1


def _stream_until_cut(proxy) -> bytes:
    """A streamed chat request whose answer starts (200) and is then cut off."""
    received = bytearray()
    with pytest.raises(httpx.HTTPError):
        with httpx.stream(
            "POST",
            proxy.url + "/v1/chat/completions",
            json={"model": "m", "messages": [], "stream": True},
        ) as response:
            assert response.status_code == 200
            for chunk in response.iter_raw():
                received.extend(chunk)
    return bytes(received)
