"""The learning queue, the tenant's numbers, and what would be injected."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from proxy.admin import memory_ops as ops
from proxy.admin.ui.session import PREFIX
from proxy.admin.ui.web import Forbidden, form, one, page, redirect, signed_in, url
from proxy.memory.scoping import SCOPE_KEY, MemoryScope
from proxy.relay.hooks import ChatContext
from proxy.relay.timing import request_id

if TYPE_CHECKING:
    from proxy.admin.ui.inspector import Inspector

SHOWN = ("pending", "leased", "dead")
_SPACE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


async def jobs_page(ui: Inspector, request: Request) -> Response:
    identity, _ = signed_in(request)
    picked = [s for s in request.query_params.getlist("status") if s in (*SHOWN, "done")]
    statuses = picked or list(SHOWN)
    jobs = await ui.jobs.list_jobs(identity.tenant, statuses, 200)
    counts = await ui.jobs.job_counts(identity.tenant)
    return page(ui, request, "jobs.html", jobs=jobs, counts=counts, statuses=statuses)


async def retry(ui: Inspector, request: Request) -> Response:
    identity, session = signed_in(request)
    fields = await form(request)
    if not ui.sessions.csrf_ok(session, one(fields, "csrf")):
        raise Forbidden("this form did not come from your session")
    await ui.jobs.retry(identity.tenant, request.path_params["job_id"])
    return redirect(url("/jobs"))


async def stats_page(ui: Inspector, request: Request) -> Response:
    identity, _ = signed_in(request)
    stats = await ops.tenant_stats(ui.store, ui.jobs, identity.tenant)
    jobs = stats.get("jobs", {})
    backlog = int(jobs.get("pending", 0)) + int(jobs.get("leased", 0))
    return page(
        ui, request, "stats.html", stats=stats, backlog=backlog, recall=ui.tally.of(identity.tenant)
    )


def _text(content: object) -> str:
    """A system message's content as shown: a string, or its parts one after another."""
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def _spaces(raw: str, limit: int) -> tuple[str, ...]:
    spaces = [s.strip() for s in raw.split(",") if s.strip()]
    spaces = [s for s in spaces if len(s) <= 128 and set(s) <= _SPACE_CHARS]
    return tuple(dict.fromkeys(spaces))[:limit] or ("default",)


async def inject_page(ui: Inspector, request: Request) -> Response:
    """Runs the recall interceptor itself on a one-message request, as the chat route
    would, and shows the system message it produced: what the model would be sent."""
    identity, _ = signed_in(request)
    message = request.query_params.get("message", "")[:8000]
    system = request.query_params.get("system", "")[:8000]
    spaces = _spaces(request.query_params.get("spaces", ""), ui.settings.max_read_spaces)
    outcome = None
    if message.strip():
        messages = [{"role": "user", "content": message}]
        if system.strip():
            messages.insert(0, {"role": "system", "content": system})
        ctx = ChatContext(
            request_id=request_id(request.scope),
            headers={},
            body={"model": "preview", "messages": messages},
        )
        ctx.state[SCOPE_KEY] = MemoryScope(identity.tenant, spaces[0], spaces, "read")
        await ui.preview.before(ctx)
        sent = ctx.body.get("messages") or []
        first = next(
            (m for m in sent if isinstance(m, dict) and m.get("role") in ("system", "developer")),
            None,
        )
        headers = {k.decode(): v.decode("latin-1") for k, v in ctx.response_headers}
        ids = list(ctx.state.get("recalled_ids") or [])
        outcome = {
            "system": _text(first.get("content")) if first else None,
            "changed": ctx.body_changed,
            "status": headers.get("x-memrelay-recall-status", "-"),
            "ms": headers.get("x-memrelay-recall-ms", "-"),
            "ids": ids,
        }
    return page(
        ui,
        request,
        "inject.html",
        message=message,
        system=system,
        spaces=",".join(spaces),
        outcome=outcome,
        prefix=PREFIX,
    )
