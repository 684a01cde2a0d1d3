"""Memory pages: search and browse, one memory's timeline, correct, forget."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from memory_core.model import KINDS, STATUSES, Event, Memory, NewMemory
from memory_core.recall import RecallQuery
from memory_core.store import ListQuery
from proxy.admin import memory_ops as ops
from proxy.admin.ui.session import PREFIX, Session
from proxy.admin.ui.web import Forbidden, form, one, page, redirect, signed_in, url
from proxy.relay.timing import request_id

if TYPE_CHECKING:
    from proxy.admin.ui.inspector import Inspector

PAGE_SIZE = 25
SEARCH_TOP_K = 25
CHAIN_LIMIT = 50
ACTOR = "inspector"


def _picked(request: Request, name: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    values = [v for raw in request.query_params.getlist(name) for v in raw.split(",") if v]
    if allowed is not None:
        values = [v for v in values if v in allowed]
    return list(dict.fromkeys(values))


async def _spaces(ui: Inspector, tenant: str) -> list[str]:
    stats = await ui.store.stats(tenant)
    return sorted(stats.get("by_space", {}))


def _csrf(ui: Inspector, session: Session, fields: dict[str, list[str]]) -> None:
    if not ui.sessions.csrf_ok(session, one(fields, "csrf")):
        raise Forbidden("this form did not come from your session")


async def home(ui: Inspector, request: Request) -> Response:
    signed_in(request)
    return redirect(PREFIX + "/memories")


async def listing(ui: Inspector, request: Request) -> Response:
    """Search (hybrid recall, with each score's breakdown) or browse with filters."""
    identity, _ = signed_in(request)
    tenant = identity.tenant
    known = await _spaces(ui, tenant)
    spaces = _picked(request, "space")
    kinds = _picked(request, "kind", KINDS)
    statuses = _picked(request, "status", STATUSES)
    q = request.query_params.get("q", "").strip()[:2000]
    cursor = request.query_params.get("cursor") or None
    if cursor is not None and not (cursor.isascii() and cursor.isdigit() and len(cursor) < 19):
        cursor = None
    results: list[Any] = []
    items: list[Memory] = []
    next_cursor = None
    if q:
        results = await ui.store.recall(
            RecallQuery(tenant, spaces or known or ["default"], q, SEARCH_TOP_K, kinds or None)
        )
    else:
        listed = await ui.store.list(
            ListQuery(
                tenant=tenant,
                spaces=spaces or None,
                statuses=statuses or list(STATUSES),
                kinds=kinds or None,
                limit=PAGE_SIZE,
                cursor=cursor,
            )
        )
        items, next_cursor = listed.items, listed.next_cursor
    filters = {"q": q, "space": spaces, "kind": kinds, "status": statuses}
    context = {
        "known_spaces": known,
        "kinds": KINDS,
        "statuses": STATUSES,
        "filters": filters,
        "results": results,
        "items": items,
        "next_url": url("/memories", cursor=next_cursor, **filters) if next_cursor else None,
        "first_url": url("/memories", **filters) if cursor else None,
    }
    template = "memories_table.html" if request.headers.get("hx-target") else "memories.html"
    return page(ui, request, template, **context)


async def _chain(ui: Inspector, tenant: str, memory: Memory) -> tuple[list[Memory], list[Memory]]:
    """What this memory replaced (from its `supersedes` events, transitively) and what
    replaced it (following `superseded_by`), each capped."""
    before: list[Memory] = []
    frontier = [memory.id]
    seen = {memory.id}
    while frontier and len(before) < CHAIN_LIMIT:
        current = frontier.pop()
        for event in await ui.store.history(tenant, current):
            old_id = event.detail.get("supersedes") if event.action == "supersedes" else None
            if isinstance(old_id, str) and old_id not in seen:
                seen.add(old_id)
                old = await ui.store.get(tenant, old_id)
                if old is not None:
                    before.append(old)
                    frontier.append(old_id)
    after: list[Memory] = []
    current_m: Memory | None = memory
    while current_m is not None and current_m.superseded_by and len(after) < CHAIN_LIMIT:
        if current_m.superseded_by in seen:
            break
        seen.add(current_m.superseded_by)
        current_m = await ui.store.get(tenant, current_m.superseded_by)
        if current_m is not None:
            after.append(current_m)
    before.sort(key=lambda m: m.created_at)
    return before, after


def _exchanges(memory: Memory, events: list[Event]) -> list[tuple[Event, dict[str, Any] | None]]:
    """Each event beside the exchange it came from: the provenance trail holds the one
    that created the memory, then one entry per reinforcement, in order (the newest 50)."""
    trail = [p for p in memory.provenance if isinstance(p, dict)]
    reinforced = sum(e.action == "reinforced" for e in events)
    shift = 1 + reinforced - len(trail)  # entries cut from the start of a long trail
    rows: list[tuple[Event, dict[str, Any] | None]] = []
    index = 0
    for event in events:
        found = None
        if event.action in ("added", "reinforced"):
            index += event.action == "reinforced"
            if 0 <= index - shift < len(trail):
                found = trail[index - shift]
        elif event.action == "supersedes" and trail and shift <= 0:
            found = trail[-shift] if -shift < len(trail) else None
        rows.append((event, found))
    return rows


async def timeline(ui: Inspector, request: Request) -> Response:
    identity, _ = signed_in(request)
    tenant = identity.tenant
    memory = await ops.require_memory(ui.store, tenant, request.path_params["memory_id"])
    events = await ops.history(ui.store, tenant, memory.id)
    before, after = await _chain(ui, tenant, memory)
    return page(
        ui,
        request,
        "memory.html",
        memory=memory,
        rows=_exchanges(memory, events),
        before=before,
        after=after,
    )


async def correct_page(ui: Inspector, request: Request) -> Response:
    identity, _ = signed_in(request)
    memory = await ops.require_memory(ui.store, identity.tenant, request.path_params["memory_id"])
    return page(ui, request, "correct.html", memory=memory, kinds=KINDS, error="")


async def correct(ui: Inspector, request: Request) -> Response:
    """An edit supersedes: the old version stays in the timeline, the new one is active."""
    identity, session = signed_in(request)
    fields = await form(request)
    _csrf(ui, session, fields)
    tenant = identity.tenant
    memory = await ops.require_memory(ui.store, tenant, request.path_params["memory_id"])
    kind = one(fields, "kind", memory.kind)
    rid = request_id(request.scope)
    new = NewMemory(
        content=one(fields, "content"),
        kind=kind if kind in KINDS else memory.kind,
        subject=memory.subject,
        attribute=memory.attribute,
        confidence=1.0,
        source="admin",
        provenance={"via": "inspector", "request_id": rid, "time": time.time()},
    )
    _, replacement = await ui.store.supersede(
        tenant, memory.id, new, f"corrected in the inspector (request {rid})", actor=ACTOR
    )
    return redirect(PREFIX + f"/memories/{replacement.id}")


async def forget_page(ui: Inspector, request: Request) -> Response:
    """The dry run: this memory and every earlier version it superseded go together."""
    identity, _ = signed_in(request)
    memory = await ops.require_memory(ui.store, identity.tenant, request.path_params["memory_id"])
    before, _ = await _chain(ui, identity.tenant, memory)
    doomed = [memory, *[m for m in before if m.status != "forgotten"]]
    return page(ui, request, "forget.html", memory=memory, doomed=doomed)


async def forget(ui: Inspector, request: Request) -> Response:
    identity, session = signed_in(request)
    fields = await form(request)
    _csrf(ui, session, fields)
    reason = ops.forget_reason("inspector", request_id(request.scope))
    memory = await ui.store.forget(
        identity.tenant, request.path_params["memory_id"], reason, actor=ACTOR
    )
    return redirect(PREFIX + f"/memories/{memory.id}")


async def forget_query_page(ui: Inspector, request: Request) -> Response:
    """Forget by meaning, dry run first: the list shown is exactly what the button forgets."""
    identity, _ = signed_in(request)
    q = request.query_params.get("q", "").strip()[:2000]
    known = await _spaces(ui, identity.tenant)
    spaces = _picked(request, "space") or known or ["default"]
    matches = await ops.forget_matches(ui.store, identity.tenant, spaces, q, 10, 0.5) if q else []
    return page(ui, request, "forget_query.html", q=q, matches=matches, known_spaces=known)


async def forget_query(ui: Inspector, request: Request) -> Response:
    identity, session = signed_in(request)
    fields = await form(request)
    _csrf(ui, session, fields)
    ids = list(dict.fromkeys(fields.get("id", [])))[:100]
    for memory_id in ids:  # all of this tenant's, or nothing is forgotten
        await ops.require_memory(ui.store, identity.tenant, memory_id)
    reason = ops.forget_reason("inspector", request_id(request.scope), by_query=True)
    for memory_id in ids:
        memory = await ui.store.get(identity.tenant, memory_id)
        if memory is not None and memory.status != "forgotten":
            await ui.store.forget(identity.tenant, memory_id, reason, actor=ACTOR)
    return redirect(url("/memories", status=["forgotten"]))
