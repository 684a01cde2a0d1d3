"""Chat completions through the proxy: byte-exact streams, the side parser, the SDK."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from proxy.relay.exchange import Exchange
from proxy.relay.hooks import ChatContext
from tests.fake_upstream import Reply, chat_chunk, completion, sse_event


class RecordingHook:
    """A real interceptor that keeps every exchange it is handed."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    async def before(self, ctx: ChatContext) -> None:
        return None

    def response_started(self, ctx: ChatContext, status: int) -> None:
        return None

    async def after(self, ctx: ChatContext, exchange: Exchange) -> None:
        self.exchanges.append(exchange)

    def wait(self, count: int = 1, timeout: float = 3.0) -> list[Exchange]:
        deadline = time.monotonic() + timeout
        while len(self.exchanges) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.exchanges


TRICKY_STREAM = [
    b": keep-alive comment\n\n",
    b"event: message\nid: 1\n" + chat_chunk({"role": "assistant", "content": ""}),
    chat_chunk({"content": "Grüße, 世界 "}),
    chat_chunk({"content": '🙂 and\\n a "quote"'}),
    b"\r\n",
    b'data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","model":"fake-model",'
    b'"choices":[{"index":0,"delta":{"content":" split"},',
    b'"finish_reason":null}]}\n\n',
    chat_chunk({}, finish="stop"),
    sse_event(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11},
        }
    ),
    b"data: [DONE]\n\n",
]


def test_stream_bytes_reach_client_unchanged(fake, make_proxy):
    hook = RecordingHook()
    proxy = make_proxy(interceptors=[hook])
    fake.script.append(Reply.sse(TRICKY_STREAM, delay=0.005))
    received = bytearray()
    with httpx.stream(
        "POST",
        proxy.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        for chunk in response.iter_raw():
            received.extend(chunk)
    assert bytes(received) == b"".join(TRICKY_STREAM) == fake.sent[0]
    exchange = hook.wait()[0]
    assert exchange.streamed and exchange.done and exchange.complete
    assert exchange.choices[0].content == 'Grüße, 世界 🙂 and\\n a "quote" split'
    assert exchange.choices[0].finish_reason == "stop"
    assert exchange.usage == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}


def test_sdk_streaming_with_tool_calls_is_reassembled(fake, make_proxy):
    hook = RecordingHook()
    proxy = make_proxy(interceptors=[hook])
    chunks = [
        chat_chunk(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ],
            }
        ),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chat_chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"},
                    }
                ]
            }
        ),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chat_chunk({}, finish="tool_calls"),
        b"data: [DONE]\n\n",
    ]
    fake.script.append(Reply.sse(chunks))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "weather?"}],
        tools=tools,
        tool_choice="auto",
        stream=True,
    )
    deltas = [c for c in stream]
    assert deltas[-1].choices[0].finish_reason == "tool_calls"
    sent = fake.chat_requests()[0].json()
    assert sent["tools"] == tools and sent["tool_choice"] == "auto"
    exchange = hook.wait()[0]
    calls = exchange.message()["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["id"] == "call_a" and calls[1]["id"] == "call_b"


def test_n_greater_than_one_and_usage_only_chunks(fake, make_proxy):
    hook = RecordingHook()
    proxy = make_proxy(interceptors=[hook])
    chunks = [
        chat_chunk({"role": "assistant", "content": "A"}, index=0),
        chat_chunk({"role": "assistant", "content": "B"}, index=1),
        chat_chunk({"content": "a"}, index=0),
        chat_chunk({"content": "b"}, index=1, finish="stop"),
        chat_chunk({}, index=0, finish="length"),
        sse_event({"id": "x", "choices": [], "usage": {"total_tokens": 9}}),
        b"data: [DONE]\n\n",
    ]
    fake.script.append(Reply.sse(chunks))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test")
    list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    exchange = hook.wait()[0]
    assert [(c.index, c.content, c.finish_reason) for c in exchange.choices] == [
        (0, "Aa", "length"),
        (1, "Bb", "stop"),
    ]
    assert exchange.usage == {"total_tokens": 9}
    sent = fake.chat_requests()[0].json()
    assert sent["n"] == 2 and sent["stream_options"] == {"include_usage": True}


def test_upstream_closing_without_done_is_tolerated(fake, make_proxy):
    hook = RecordingHook()
    proxy = make_proxy(interceptors=[hook])
    chunks = [
        chat_chunk({"role": "assistant", "content": "no done"}),
        chat_chunk({}, finish="stop"),
    ]
    fake.script.append(Reply.sse(chunks))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test")
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    assert text == "no done"
    exchange = hook.wait()[0]
    assert not exchange.done and exchange.complete


def test_non_streaming_body_unchanged_and_parsed(fake, make_proxy):
    hook = RecordingHook()
    proxy = make_proxy(interceptors=[hook])
    body = completion(
        "Sure.",
        tool_calls=[
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
        ],
    )
    raw = json.dumps(body, indent=1).encode()
    fake.script.append(Reply.raw(raw))
    response = httpx.post(
        proxy.url + "/v1/chat/completions",
        json={
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "seed": 7,
            "response_format": {"type": "json_object"},
            "logprobs": True,
            "vendor_x": {"a": 1},
        },
    )
    assert response.content == raw
    sent = fake.chat_requests()[0].json()
    assert sent["seed"] == 7 and sent["vendor_x"] == {"a": 1} and sent["logprobs"] is True
    assert sent["response_format"] == {"type": "json_object"}
    exchange = hook.wait()[0]
    assert not exchange.streamed and exchange.choices[0].content == "Sure."
    assert exchange.message()["tool_calls"][0]["function"]["name"] == "f"
    assert exchange.usage["total_tokens"] == 7


def test_request_bytes_forwarded_untouched_without_interceptors(fake, proxy):
    raw = b'{"model":"m",  "messages":[{"role":"user","content":"caf\\u00e9"}],"zzz":[1,2]}'
    httpx.post(
        proxy.url + "/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert fake.chat_requests()[0].body == raw


@pytest.mark.parametrize("stream", [False, True])
def test_async_sdk(fake, proxy, stream):
    async def run() -> str:
        async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test") as client:
            if stream:
                out = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}], stream=True
                )
                return "".join([c.choices[0].delta.content or "" async for c in out if c.choices])
            result = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
            return result.choices[0].message.content

    assert asyncio.run(run()) == "Hello from fake."


def test_error_status_passes_through_even_when_streaming(fake, proxy):
    error = {
        "error": {"message": "bad key", "type": "invalid_request_error", "code": "invalid_api_key"}
    }
    fake.script.append(Reply.json(error, status=401))
    response = httpx.post(
        proxy.url + "/v1/chat/completions", json={"model": "m", "messages": [], "stream": True}
    )
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    assert response.json() == error
