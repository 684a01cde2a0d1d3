"""The LLM seam: JSON answers from any OpenAI-compatible chat endpoint.

Structured output is asked for as strictly as the server allows: a JSON schema, else
`json_object`, else plain text read tolerantly; the level that worked is remembered.
Reasoning models on llama.cpp and vLLM get `chat_template_kwargs.enable_thinking=false`,
dropped for good if the server rejects the field. Transient failures (connect errors,
timeouts, 429, 5xx) are retried with jittered backoff, a bounded number of times.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from extraction.parsing import parse_json

log = logging.getLogger("memrelay.llm")
LEVELS = ("json_schema", "json_object", "text")
FORWARDED_CREDENTIALS = ("authorization", "api-key", "openai-organization", "openai-project")


class LLMError(Exception):
    """The model could not give a usable answer (after retries)."""


class TransientLLMError(LLMError):
    """Worth retrying: the server was unreachable, overloaded or failing."""


class LLMOutputError(LLMError):
    """The model answered, but not with usable JSON (the message may quote its output)."""


def transport_cause(exc: httpx.TransportError, timeout: float | None) -> str:
    """What went wrong on the wire, in words: timeouts say which and after how long,
    refused connections say so; never an empty reason."""
    after = f" after {timeout:g} s" if timeout else ""
    if isinstance(exc, httpx.ConnectTimeout):
        return f"connect timeout{after}"
    if isinstance(exc, httpx.ReadTimeout):
        return f"read timeout{after} (no answer in time)"
    if isinstance(exc, httpx.WriteTimeout):
        return f"write timeout{after}"
    if isinstance(exc, httpx.PoolTimeout):
        return f"no free connection{after}"
    text = str(exc).strip()
    if isinstance(exc, httpx.ConnectError):
        root = _root_cause(exc)
        if isinstance(root, ConnectionRefusedError) or "refused" in text.lower():
            return "connection refused"
        detail = str(root).strip() or text or type(root).__name__
        return f"cannot connect: {detail}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _root_cause(exc: BaseException) -> BaseException:
    """httpx hides the OS error ("All connection attempts failed") behind its chain."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = exc.__cause__ or exc.__context__
        if inner is None:
            break
        if isinstance(exc, ExceptionGroup) and exc.exceptions:
            inner = exc.exceptions[0]
        exc = inner
    return exc


def upstream_message(response: httpx.Response, limit: int = 300) -> str:
    """The error message an OpenAI-style server sent, else the start of its body."""
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str) and message.strip():
            return message.strip()[:limit]
    except (ValueError, AttributeError):
        pass
    return response.text[:limit].strip() or "(empty body)"


class LLMClient(Protocol):
    async def complete_json(
        self,
        messages: list[dict[str, Any]],
        schema: dict[str, Any],
        *,
        model: str | None = None,
        credentials: dict[str, str] | None = None,
    ) -> Any: ...


class OpenAICompatibleLLM:
    """Chat completions over httpx with structured-output fallback."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        attempts: int = 3,
        max_wait: float = 4.0,
        thinking_off: bool = True,
        max_tokens: int = 800,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        root = base_url.rstrip("/")
        self.url = (root if root.endswith("/v1") else root + "/v1") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.attempts = attempts
        self.max_wait = max_wait
        self.max_tokens = max_tokens
        self.level = 0
        self.timeout = timeout
        self.send_template_kwargs = thinking_off
        self.client = client or httpx.AsyncClient(timeout=timeout, trust_env=False)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def complete_json(
        self,
        messages: list[dict[str, Any]],
        schema: dict[str, Any],
        *,
        model: str | None = None,
        credentials: dict[str, str] | None = None,
    ) -> Any:
        model = self.model or model
        if not model:
            raise LLMError("no model: configure an extraction model or pass the request's")
        headers = {"content-type": "application/json"}
        for name, value in (credentials or {}).items():
            if name.lower() in FORWARDED_CREDENTIALS:
                headers[name.lower()] = value
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_random_exponential(multiplier=0.2, max=self.max_wait),
            retry=retry_if_exception_type(TransientLLMError),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                text = await self._negotiate(messages, schema, model, headers)
        try:
            return parse_json(text)
        except ValueError as exc:
            raise LLMOutputError(str(exc)) from exc

    async def _negotiate(
        self,
        messages: list[dict[str, Any]],
        schema: dict[str, Any],
        model: str,
        headers: dict[str, str],
    ) -> str:
        """Send, stepping down the structured-output ladder on 400s."""
        while True:
            body: dict[str, Any] = {
                "model": model,
                "messages": messages,
                "temperature": 0,
                "max_tokens": self.max_tokens,
                "stream": False,
            }
            level = LEVELS[self.level]
            if level == "json_schema":
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "memrelay_output", "schema": schema, "strict": False},
                }
            elif level == "json_object":
                body["response_format"] = {"type": "json_object"}
            if self.send_template_kwargs:
                body["chat_template_kwargs"] = {"enable_thinking": False}
            try:
                response = await self.client.post(self.url, json=body, headers=headers)
            except httpx.TransportError as exc:
                cause = transport_cause(exc, self.timeout)
                raise TransientLLMError(f"extraction LLM at {self.url}: {cause}") from exc
            if response.status_code == 400 or response.status_code == 422:
                if self.send_template_kwargs:
                    log.info("server refused chat_template_kwargs; sending without it")
                    self.send_template_kwargs = False
                    continue
                if self.level < len(LEVELS) - 1:
                    log.info(
                        "server refused response_format %s; trying %s",
                        level,
                        LEVELS[self.level + 1],
                    )
                    self.level += 1
                    continue
                raise LLMError(
                    f"extraction LLM refused the request: HTTP {response.status_code}:"
                    f" {upstream_message(response)}"
                )
            if response.status_code == 429 or response.status_code >= 500:
                raise TransientLLMError(
                    f"extraction LLM answered HTTP {response.status_code}:"
                    f" {upstream_message(response)}"
                )
            if response.status_code >= 300:
                raise LLMError(
                    f"extraction LLM answered HTTP {response.status_code}:"
                    f" {upstream_message(response)}"
                )
            try:
                message = response.json()["choices"][0]["message"]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise LLMOutputError(f"not a chat completion: {response.text[:300]}") from exc
            return message.get("content") or ""
