"""The chat-template fallback: a server that has no system role gets the memory in the
user turn, after one refused request, and from then on directly for that model.

Servers that render Hugging Face chat templates without polyfills (vLLM, TGI,
transformers) answer 400 `TemplateError: System role not supported` for Gemma- or
Mistral-v0.1-style templates when a system message is present. When memrelay itself
inserted that message, the request is sent once more with the memory prepended to the
first user message. It is safe because nothing has reached the client yet (the 400 is
read, not relayed), and narrow: only a 400, only one naming the system (or developer)
role, only when memrelay added the message, only once per request.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator

import httpx

log = logging.getLogger("memrelay.template")

NAMES_SYSTEM_ROLE = re.compile(r"\b(system|developer)[ _-]?role\b", re.IGNORECASE)
ERROR_BODY_LIMIT = 64 * 1024  # a template error is small; a larger 400 is relayed unread
MAX_MODELS = 1024


class TemplateFallback:
    """Where memory goes in a chat request, per model: the configured placement until a
    model's server refuses a system role, `user` after that (kept in this process)."""

    def __init__(self, placement: str = "system", enabled: bool = True) -> None:
        self.placement = placement
        self.enabled = enabled
        self._user_turn: OrderedDict[str, None] = OrderedDict()

    def placement_for(self, model: object) -> str:
        key = _key(model)
        if key in self._user_turn:
            self._user_turn.move_to_end(key)
            return "user"
        return self.placement

    def remember(self, model: object) -> None:
        key = _key(model)
        if key not in self._user_turn:
            log.warning(
                "the upstream refused a system role for model %r: memory goes into the"
                " first user message for it from now on (MEMRELAY_MEMORY_PLACEMENT=user"
                " sets this from the start)",
                key,
            )
        self._user_turn[key] = None
        self._user_turn.move_to_end(key)
        while len(self._user_turn) > MAX_MODELS:
            self._user_turn.popitem(last=False)

    def may_retry(self, status: int, inserted_message: bool) -> bool:
        return self.enabled and status == 400 and inserted_message


def _key(model: object) -> str:
    return model if isinstance(model, str) else ""


async def read_small_error(response: httpx.Response) -> bytes | None:
    """The body of a small, uncompressed error answer, or None (then it is relayed as it
    comes, unread)."""
    length = response.headers.get("content-length", "")
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity" or not length.isdigit() or int(length) > ERROR_BODY_LIMIT:
        return None
    return await response.aread()


def names_system_role(body: bytes) -> bool:
    return NAMES_SYSTEM_ROLE.search(body.decode("utf-8", "replace")) is not None


class _Replay(httpx.AsyncByteStream):
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.body


def replayable(response: httpx.Response, body: bytes) -> httpx.Response:
    """A response carrying the already-read `body`, to relay like any other (unread: a
    Response built from bytes counts as consumed, which `aiter_raw` refuses)."""
    return httpx.Response(response.status_code, headers=response.headers.raw, stream=_Replay(body))
