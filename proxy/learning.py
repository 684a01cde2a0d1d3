"""The write half: after a successful exchange, enqueue it for extraction.

Nothing here delays or fails the client's answer: the decision is made before the
request goes upstream, the job is written in the background after the answer is out.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from extraction.worker import ExtractionWorkers
from memory_core.injection import scrub
from memory_core.jobs import JobQueue
from proxy.conversation import last_user_text, learning_context
from proxy.exchange import Exchange
from proxy.hooks import ChatContext
from proxy.scoping import scope_for
from proxy.settings import Settings

log = logging.getLogger("memrelay.learning")
CREDENTIAL_HEADERS = ("authorization", "api-key", "openai-organization", "openai-project")
STATUS = "memory_status"


def reply_text(exchange: Exchange) -> str:
    """The first choice's content plus a short summary of its tool calls, echoes scrubbed."""
    if not exchange.choices:
        return ""
    choice = exchange.choices[0]
    parts = [choice.content or ""]
    for call in choice.tool_calls:
        parts.append(f"[called tool {call.name}({call.arguments[:300]})]")
    return scrub("\n".join(p for p in parts if p))


class ExtractionInterceptor:
    def __init__(self, queue: JobQueue, workers: ExtractionWorkers, settings: Settings) -> None:
        self.queue = queue
        self.workers = workers
        self.settings = settings
        self.patterns = [re.compile(p, re.IGNORECASE) for p in settings.ignore_patterns]

    async def before(self, ctx: ChatContext) -> None:
        scope = scope_for(ctx, self.settings)
        if not scope.writes:
            ctx.state[STATUS] = "off"
            return
        user = last_user_text(ctx.body.get("messages") or [])
        if not user.strip():
            self._skip(ctx, "no user text")
        elif any(p.search(user) for p in self.patterns):
            self._skip(ctx, "matches an ignore pattern")
        else:
            ctx.state[STATUS] = "queued"
            ctx.state["memory_user_text"] = user

    def _skip(self, ctx: ChatContext, why: str) -> None:
        ctx.state[STATUS] = "skipped"
        log.info("extraction skipped for request %s: %s", ctx.request_id, why)

    def response_started(self, ctx: ChatContext, status: int) -> None:
        if ctx.state.get(STATUS) == "queued" and not 200 <= status < 300:
            self._skip(ctx, f"upstream answered {status}")
        if STATUS in ctx.state:
            ctx.add_response_header("X-Memrelay-Memory-Status", ctx.state[STATUS])

    async def after(self, ctx: ChatContext, exchange: Exchange) -> None:
        if ctx.state.get(STATUS) != "queued":
            return
        if not exchange.complete:
            log.info("extraction skipped for request %s: the answer did not finish", ctx.request_id)
            return
        scope = scope_for(ctx, self.settings)
        payload: dict[str, Any] = {
            "user": ctx.state["memory_user_text"],
            "assistant": reply_text(exchange),
            "request_id": ctx.request_id,
            "model": ctx.body.get("model") or exchange.model,
            "time": time.time(),
            "context": learning_context(ctx.body.get("messages") or [], scope.read_spaces),
        }
        try:
            job = await self.queue.enqueue(
                scope.tenant,
                scope.write_space,
                payload,
                job_id=f"job_{ctx.request_id}",
                max_attempts=self.settings.extraction_max_attempts,
            )
        except Exception:
            log.exception("could not enqueue extraction for request %s", ctx.request_id)
            return
        credentials = {k: v for k, v in ctx.headers.items() if k in CREDENTIAL_HEADERS}
        self.workers.credentials.put(job.id, credentials)
        self.workers.wake()
