"""The side parser of streamed answers: the same answer whatever the line endings (LF,
CRLF, CR, mixed) and however the bytes are cut into chunks."""

from __future__ import annotations

import json
import random

import pytest

from proxy.relay.exchange import Exchange
from proxy.relay.sse import StreamAssembler

WORDS = ["Hello", " there", ",", " général", " 🙂", " done", "."]


def stream(eol: str) -> bytes:
    events = [
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        *(
            {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": w}}]}
            for w in WORDS
        ),
        {
            "id": "c1",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "t1", "function": {"name": "f", "arguments": "{}"}}
                        ]
                    },
                    "finish_reason": "tool_calls",
                }
            ],
        },
    ]
    lines = [": keep-alive"]
    for event in events:
        lines += [f"data: {json.dumps(event, ensure_ascii=False)}", ""]
    lines += ["data: [DONE]", ""]
    return (eol.join(lines) + eol).encode()


def assembled(chunks: list[bytes]) -> Exchange:
    exchange = Exchange(request={}, request_headers={}, status=200, streamed=True)
    parser = StreamAssembler(exchange)
    for chunk in chunks:
        parser.feed(chunk)
    parser.close()
    assert parser.bad_events == 0
    return exchange


def check(exchange: Exchange) -> None:
    assert exchange.done and exchange.model == "m" and exchange.response_id == "c1"
    choice = exchange.choices[0]
    assert choice.content == "".join(WORDS)
    assert choice.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in choice.tool_calls] == [("t1", "f", "{}")]


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_every_two_chunk_cut_gives_the_same_answer(eol: str) -> None:
    data = stream(eol)
    for cut in range(len(data) + 1):
        check(assembled([data[:cut], data[cut:]]))


@pytest.mark.parametrize("seed", range(40))
def test_random_chunks_and_mixed_line_endings(seed: int) -> None:
    rng = random.Random(seed)
    data = stream("\n")
    if seed % 2:  # mixed endings: some lines end in CRLF or CR instead
        parts = data.split(b"\n")[:-1]
        ends = [rng.choice([b"\n", b"\r\n", b"\r"]) for _ in parts]
        for i in range(len(parts) - 1):  # a CR then an empty LF line is one CRLF: not mixed
            if ends[i] == b"\r" and parts[i + 1] == b"" and ends[i + 1] == b"\n":
                ends[i] = b"\r\n"
        data = b"".join(p + e for p, e in zip(parts, ends, strict=True))
    chunks, at = [], 0
    while at < len(data):
        size = rng.choice([1, 2, 3, 7, 40, 500])
        chunks.append(data[at : at + size])
        at += size
    check(assembled(chunks))
