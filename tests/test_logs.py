"""Structured logs: JSON lines with the request id, and no memory content or keys at INFO."""

from __future__ import annotations

import io
import json
import logging

import httpx

from proxy.logs import JSONFormatter


def test_json_lines_carry_the_request_id_and_no_content(fake, memory_proxy):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    try:
        server, seed = memory_proxy(ignore_patterns=["^heartbeat"])
        seed.add("acme", "default", "The vault combination is 31-41-59")
        response = httpx.post(
            server.url + "/v1/chat/completions",
            headers={"X-Memrelay-Tenant": "acme", "X-Memrelay-Key": "mr_secret_value"},
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "heartbeat vault combination"}],
            },
        )
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    ours = [
        line for line in lines if line["request_id"] == response.headers["x-memrelay-request-id"]
    ]
    assert any("extraction skipped" in line["message"] for line in ours)
    assert all({"time", "level", "logger", "request_id", "message"} <= set(line) for line in lines)
    text = stream.getvalue()
    assert (
        "31-41-59" not in text and "mr_secret_value" not in text and "heartbeat vault" not in text
    )
