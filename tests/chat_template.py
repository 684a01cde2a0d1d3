"""A fake upstream's chat-template step, as vLLM, TGI and transformers do it: the real
Gemma-2 chat template rendered with jinja2 in a sandbox, `raise_exception` raising
`TemplateError`, which the server answers as a 400 (vLLM's error shape)."""

from __future__ import annotations

import json
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tests.fake_upstream import Recorded, Reply, completion, default_stream

# google/gemma-2-9b-it's chat_template, as published (no system role, strict alternation).
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)


def _raise(message: str) -> None:
    raise TemplateError(message)


_ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_ENV.globals["raise_exception"] = _raise
GEMMA2 = _ENV.from_string(GEMMA2_TEMPLATE)


def render(messages: list[dict[str, Any]]) -> str:
    return GEMMA2.render(messages=messages, bos_token="<bos>", add_generation_prompt=True)


def gemma_responder(request: Recorded) -> Reply | None:
    """Chat completions are rendered with the template first: a TemplateError is a 400;
    otherwise the answer's content is the rendered prompt (so tests read what the model
    would have seen)."""
    if request.path != "/v1/chat/completions" or b"memrelay-extraction" in request.body:
        return None
    body = json.loads(request.body)
    try:
        prompt = render(body["messages"])
    except TemplateError as exc:
        error = {"object": "error", "message": str(exc), "type": "BadRequestError"}
        return Reply.json({**error, "param": None, "code": 400}, status=400)
    if body.get("stream"):
        return Reply.sse(default_stream(prompt))
    return Reply.json(completion(prompt))
