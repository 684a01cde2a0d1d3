"""The write half: each successful exchange becomes an extraction job, durably.

`X-Memrelay-Memory-Status: queued` is only said once it is true. Before the response
headers go out, a draft job holding the request part is written (not yet claimable).
When the answer is complete, before its last bytes reach the client, the draft is
finished with the answer; a client that saw the whole answer therefore implies a
durable job. An answer that fails or is cut drops the draft. A draft that cannot be
written says `skipped`; a full backlog says `shed`; the same request (scope and
messages) seen within the dedup window says `duplicate` (one piece of evidence).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from extraction.commands import asks_to_forget
from extraction.worker import ChatActivity, ExtractionWorkers
from memory_core.injection import scrub
from memory_core.jobs import JobQueue, content_hash
from proxy.memory.backpressure import Backlog
from proxy.memory.conversation import last_user_text, learning_context, message_text
from proxy.memory.scoping import scope_for
from proxy.metrics import Metrics
from proxy.relay.exchange import Exchange
from proxy.relay.hooks import ChatContext
from proxy.settings import Settings

log = logging.getLogger("memrelay.learning")
CREDENTIAL_HEADERS = ("authorization", "api-key", "openai-organization", "openai-project")
STATUS = "memory_status"
JOB = "memory_job"
PAYLOAD = "memory_payload"
FINISHED = "memory_job_finished"
ACTIVE = "memory_chat_active"


def reply_text(exchange: Exchange) -> str:
    """The first choice's content plus a short summary of its tool calls, echoes scrubbed."""
    if not exchange.choices:
        return ""
    choice = exchange.choices[0]
    parts = [choice.content or ""]
    for call in choice.tool_calls:
        parts.append(f"[called tool {call.name}({call.arguments[:300]})]")
    return scrub("\n".join(p for p in parts if p))


def exchange_payload(
    ctx: ChatContext,
    user: str,
    read_spaces: tuple[str, ...],
) -> dict[str, Any]:
    """The request part of a job, written before the answer exists. The one place that
    decides what an exchange carries for extraction (the answer is added by
    `with_answer`)."""
    return {
        "user": user,
        "request_id": ctx.request_id,
        "model": ctx.body.get("model"),
        "time": time.time(),
        # earlier turns and the read spaces: reconciliation acts on every readable space
        "context": learning_context(ctx.messages, read_spaces),
    }


def with_answer(payload: dict[str, Any], exchange: Exchange) -> dict[str, Any]:
    """The job's payload once the answer is complete."""
    return {
        **payload,
        "assistant": reply_text(exchange),
        "model": payload.get("model") or exchange.model,
    }


def request_digest(tenant: str, space: str, messages: list[Any], thread: str | None = None) -> str:
    """Same scope and same conversation, the same digest: the memory block memrelay
    injected (which changes as memories do) is not part of it. `thread` names a
    conversation stored upstream (Responses `previous_response_id`)."""
    turns = []
    for message in messages:
        if isinstance(message, dict):
            text = message_text(message)
            if text:
                turns.append([message.get("role"), text])
    if thread is not None:
        return content_hash([tenant, space, turns, thread])
    return content_hash([tenant, space, turns])


class ExtractionInterceptor:
    def __init__(
        self,
        queue: JobQueue,
        workers: ExtractionWorkers,
        settings: Settings,
        metrics: Metrics | None = None,
        activity: ChatActivity | None = None,
    ) -> None:
        self.queue = queue
        self.workers = workers
        self.settings = settings
        self.metrics = metrics
        self.activity = activity
        self.backlog = Backlog(
            queue, settings.extraction_max_backlog, settings.extraction_max_backlog_per_tenant
        )
        self.patterns = [re.compile(p, re.IGNORECASE) for p in settings.ignore_patterns]
        self._tasks: set[asyncio.Task[None]] = set()

    async def before(self, ctx: ChatContext) -> None:
        if self.activity is not None:
            self.activity.begin()
            ctx.state[ACTIVE] = True
        scope = scope_for(ctx, self.settings)
        if not scope.writes:
            ctx.state[STATUS] = "off"
            return
        user = last_user_text(ctx.messages)
        if not user.strip():
            self._skip(ctx, "no user text")
            return
        if any(p.search(user) for p in self.patterns):
            self._skip(ctx, "matches an ignore pattern")
            return
        if not await self.backlog.admit(scope.tenant):
            ctx.state[STATUS] = "shed"
            return
        payload = exchange_payload(ctx, user, scope.read_spaces)
        digest = None  # a dedup window of 0 learns every request
        if self.settings.extraction_dedup_seconds > 0:
            digest = request_digest(scope.tenant, scope.write_space, ctx.messages, ctx.thread)
        try:
            job = await self.queue.reserve(
                scope.tenant,
                scope.write_space,
                payload,
                f"job_{ctx.request_id}",
                self.settings.extraction_max_attempts,
                digest,
                time.time() - self.settings.extraction_dedup_seconds,
                # a forget waits for the tenant's earlier jobs (memory_core/jobs.py)
                forgets=asks_to_forget(user),
            )
        except Exception as exc:
            self._skip(ctx, f"the job could not be written: {type(exc).__name__}: {exc}", "error")
            return
        if job is None:
            ctx.state[STATUS] = "duplicate"
            log.info("request %s repeats one already queued: learned once", ctx.request_id)
            return
        ctx.state.update({STATUS: "queued", JOB: job.id, PAYLOAD: payload})
        credentials = {k: v for k, v in ctx.headers.items() if k in CREDENTIAL_HEADERS}
        self.workers.credentials.put(job.id, credentials, scope.tenant)

    def _skip(self, ctx: ChatContext, why: str, level: str = "info") -> None:
        ctx.state[STATUS] = "skipped"
        getattr(log, level)("extraction skipped for request %s: %s", ctx.request_id, why)

    def response_started(self, ctx: ChatContext, status: int) -> None:
        if ctx.state.get(STATUS) == "queued" and not 200 <= status < 300:
            self._skip(ctx, f"upstream answered {status}")
        if STATUS in ctx.state:
            ctx.add_response_header("X-Memrelay-Memory-Status", ctx.state[STATUS])
            if self.metrics is not None:
                self.metrics.learning.labels(ctx.state[STATUS]).inc()

    def wants_answer(self, ctx: ChatContext) -> bool:
        """Only an exchange queued for learning needs its answer read."""
        return ctx.state.get(STATUS) == "queued"

    async def answer_complete(self, ctx: ChatContext, exchange: Exchange) -> None:
        """The whole answer is known and its last bytes not yet sent: make the job real."""
        job_id = ctx.state.get(JOB)
        if ctx.state.get(STATUS) != "queued" or job_id is None or not exchange.complete:
            return
        try:
            finished = await self.queue.finish_draft(
                job_id, with_answer(ctx.state[PAYLOAD], exchange)
            )
        except Exception as exc:
            self._count_draft("failed")
            log.error(
                "request %s: could not finish job %s: %s: %s",
                ctx.request_id,
                job_id,
                type(exc).__name__,
                exc,
            )
            return
        if finished:
            ctx.state[FINISHED] = True
            self._count_draft("finished")
            self.workers.wake()

    def finished(self, ctx: ChatContext) -> None:
        """Always called when the request ends: users' chat count, and a draft whose
        answer never completed is dropped."""
        if ctx.state.pop(ACTIVE, False) and self.activity is not None:
            self.activity.end()
        job_id = ctx.state.get(JOB)
        if job_id is not None and not ctx.state.get(FINISHED):
            ctx.state.pop(JOB)
            self.workers.credentials.drop(job_id)
            self._count_draft("dropped")
            task = asyncio.get_running_loop().create_task(self._drop(job_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _drop(self, job_id: str) -> None:
        try:
            await self.queue.drop_draft(job_id)
        except Exception as exc:  # the pruner deletes it later
            log.warning("could not drop draft %s: %s", job_id, exc)

    def _count_draft(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.drafts.labels(outcome).inc()

    async def after(self, ctx: ChatContext, exchange: Exchange) -> None:
        return None
