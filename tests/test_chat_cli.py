"""`memrelay chat` against a served memrelay: replies, injected memories, queue status."""

from __future__ import annotations

from typer.testing import CliRunner

from proxy.cli.main import app


def test_chat_shows_injected_memories_and_learning(fake, memory_proxy):
    server, seed = memory_proxy()
    memory = seed.add("acme", "default", "The user [really] likes green tea")
    result = CliRunner().invoke(
        app,
        ["chat", "--url", server.url, "--tenant", "acme"],
        input="What do I like to drink?\n/quit\n",
        env={"COLUMNS": "300"},
    )
    assert result.exit_code == 0, result.output
    assert "Hello from fake." in result.output
    assert f"injected {memory.id}: The user [really] likes green tea" in result.output
    assert "recall: ok; learning: queued" in result.output
    sent = fake.chat_requests()[-1].json()
    assert sent["stream"] is True and sent["messages"][-1]["content"] == "What do I like to drink?"


def test_chat_reports_an_unreachable_server():
    result = CliRunner().invoke(app, ["chat", "--url", "http://127.0.0.1:9"], input="hi\n")
    assert result.exit_code == 1 and "error" in result.output
