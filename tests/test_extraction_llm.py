"""The LLM seam against the real fake server: structured-output ladder, retries, parsing."""

from __future__ import annotations

import asyncio
import json

import pytest

from extraction.facts import read_extraction
from extraction.llm import LLMError, OpenAICompatibleLLM, TransientLLMError
from extraction.parsing import NoJSON, parse_json
from tests.fake_upstream import Reply, completion

SCHEMA = {"type": "object", "properties": {"facts": {"type": "array"}}}
MESSAGES = [{"role": "system", "content": "extract"}, {"role": "user", "content": "hi"}]


def ask(url, **kwargs):
    async def run():
        llm = OpenAICompatibleLLM(url, max_wait=0.05, **kwargs)
        try:
            return await llm.complete_json(
                MESSAGES,
                SCHEMA,
                model="m",
                credentials={"authorization": "Bearer k", "cookie": "x"},
            ), llm
        finally:
            await llm.aclose()

    return asyncio.run(run())


def test_json_schema_first_with_thinking_off(fake, fake_url):
    fake.script.append(Reply.json(completion('{"facts": []}')))
    answer, _llm = ask(fake_url + "/v1")
    assert answer == {"facts": []}
    sent = fake.requests[0]
    body = sent.json()
    assert sent.path == "/v1/chat/completions"
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert sent.header("authorization") == "Bearer k" and sent.header("cookie") is None


def test_ladder_steps_down_and_remembers(fake, fake_url):
    rejected = Reply.json({"error": {"message": "unsupported"}}, status=400)
    fake.script.extend([rejected, rejected, rejected])  # kwargs, json_schema, json_object
    fake.script.append(Reply.json(completion('Sure! ```json\n{"facts": [1]}\n``` hope it helps')))
    answer, llm = ask(fake_url)
    assert answer == {"facts": [1]}
    bodies = [r.json() for r in fake.requests]
    assert "chat_template_kwargs" in bodies[0] and "chat_template_kwargs" not in bodies[1]
    assert bodies[1]["response_format"]["type"] == "json_schema"
    assert bodies[2]["response_format"]["type"] == "json_object"
    assert "response_format" not in bodies[3]
    assert llm.level == 2 and llm.send_template_kwargs is False


def test_transient_errors_are_retried_then_given_up(fake, fake_url):
    fake.script.append(Reply.json({"error": {}}, status=503))
    fake.script.append(Reply.json(completion('{"facts": []}')))
    assert ask(fake_url)[0] == {"facts": []}
    fake.reset()
    for _ in range(3):
        fake.script.append(Reply.json({"error": {}}, status=500))
    with pytest.raises(LLMError, match="500"):
        ask(fake_url, attempts=3)
    assert len(fake.requests) == 3


def test_unreachable_server_is_a_transient_error_that_says_refused(fake):
    with pytest.raises(TransientLLMError, match="connection refused"):
        ask("http://127.0.0.1:9", attempts=2)


def test_errors_name_the_cause(fake, fake_url):
    """A read timeout says so and after how long (it used to be an empty reason); an HTTP
    error carries its status and the upstream's own message."""
    fake.script.append(Reply.json(completion("{}"), status=200))
    fake.script[-1].first_delay = 2.0
    with pytest.raises(TransientLLMError, match=r"read timeout after 0\.3 s"):
        ask(fake_url, attempts=1, timeout=0.3)
    fake.reset()
    fake.script.append(Reply.json({"error": {"message": "model is overloaded"}}, status=503))
    with pytest.raises(TransientLLMError, match="HTTP 503: model is overloaded"):
        ask(fake_url, attempts=1)
    fake.script.append(Reply.json({"error": {"message": "bad key"}}, status=401))
    with pytest.raises(LLMError, match="HTTP 401: bad key"):
        ask(fake_url, attempts=1)


def test_garbage_answer_is_an_error(fake, fake_url):
    fake.script.append(Reply.json(completion("no json here")))
    with pytest.raises(LLMError, match="no JSON"):
        ask(fake_url)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('<think>hmm {"no": 1}</think>\n{"a": 2}', {"a": 2}),
        ('Here you go: {"a": [1, 2]} and some trailing prose.', {"a": [1, 2]}),
        ("[1, 2]", [1, 2]),
        ('junk { broken {"a": 3}', {"a": 3}),
    ],
)
def test_tolerant_parsing(text, expected):
    assert parse_json(text) == expected


def test_parsing_without_json_raises():
    with pytest.raises(NoJSON):
        parse_json("nothing to see")


def test_facts_are_read_leniently():
    extraction = read_extraction(
        {
            "facts": [
                {
                    "content": "The user likes tea",
                    "kind": "preference",
                    "confidence": 2,
                    "stated_by": "user",
                },
                {"content": "", "kind": "fact"},
                "not an object",
                {
                    "content": "The sky is green",
                    "kind": "weird",
                    "confidence": "high",
                    "stated_by": "robot",
                    "subject": {"x": 1},
                },
            ],
            "forget": ["my old address", "", None],
        }
    )
    assert [(f.content, f.kind, f.confidence, f.stated_by) for f in extraction.facts] == [
        ("The user likes tea", "preference", 1.0, "user"),
        ("The sky is green", "fact", 0.7, "user"),
    ]
    assert extraction.facts[1].subject is None
    assert extraction.skipped == 2 and extraction.forget == ["my old address"]
    assert read_extraction([]).facts == []
    with pytest.raises(ValueError):
        read_extraction("text")


def test_extraction_prompt_carries_the_exchange_as_json():
    from extraction.prompts import MARKER, extract_messages

    messages = extract_messages('I said "hi"', "Hello!")
    assert MARKER in messages[0]["content"]
    sent = json.loads(messages[1]["content"])
    assert (sent["user"], sent["assistant"]) == ('I said "hi"', "Hello!")
    assert sent["existing_memories"] == [] and sent["earlier_turns"] == []
