"""The memory inspector at /memrelay/ui: routes, error pages, the preview interceptor.

Every read and write goes through memory_core (and the helpers the admin API uses,
proxy/admin/actions.py) with the tenant of the identity the edge decided from the
session cookie: no page or form field names a tenant that is trusted.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Route

from memory_core.errors import InvalidInput, InvalidTransition, NotFound
from memory_core.jobs import JobQueue
from memory_core.store import MemoryStore
from proxy.admin.ui import memories, queue, signin
from proxy.admin.ui.session import PREFIX, BrowserSessions, Session
from proxy.admin.ui.tally import RecallTally
from proxy.admin.ui.web import HTMX, SECURITY_HEADERS, STATIC, Forbidden, Signin, page, redirect
from proxy.relay.hooks import ChatInterceptor
from proxy.settings import Settings

STATIC_FILES = {
    "ui.css": ("text/css", STATIC / "ui.css"),
    "htmx.min.js": (None, HTMX),
    "htmx.LICENSE": ("text/plain", HTMX.with_name("htmx.LICENSE")),
}


class Inspector:
    """Holds what the pages use; `routes()` is mounted beside the admin API."""

    def __init__(
        self,
        store: MemoryStore,
        jobs: JobQueue,
        sessions: BrowserSessions,
        preview: ChatInterceptor,
        settings: Settings,
        tally: RecallTally | None = None,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.sessions = sessions
        self.preview = preview  # a RecallInterceptor without metrics: the real code path
        self.settings = settings
        self.tally = tally or RecallTally()

    def tenant_choices(self, session: Session) -> list[str] | None:
        """The tenants this session may switch to; None when any tenant may be typed."""
        if session.key_id is None:
            return None
        record = self.sessions.live(session.key_id)
        if record is None or record.admin:
            return None
        return list(record.tenants)

    def routes(self) -> list[BaseRoute]:
        table: list[tuple[str, list[str], Any]] = [
            ("", ["GET"], memories.home),
            ("/signin", ["GET"], signin.form_page),
            ("/signin", ["POST"], signin.sign_in),
            ("/signout", ["POST"], signin.sign_out),
            ("/tenant", ["GET"], signin.tenant_page),
            ("/tenant", ["POST"], signin.switch_tenant),
            ("/memories", ["GET"], memories.listing),
            ("/memories/{memory_id}", ["GET"], memories.timeline),
            ("/memories/{memory_id}/correct", ["GET"], memories.correct_page),
            ("/memories/{memory_id}/correct", ["POST"], memories.correct),
            ("/memories/{memory_id}/forget", ["GET"], memories.forget_page),
            ("/memories/{memory_id}/forget", ["POST"], memories.forget),
            ("/forget", ["GET"], memories.forget_query_page),
            ("/forget", ["POST"], memories.forget_query),
            ("/jobs", ["GET"], queue.jobs_page),
            ("/jobs/{job_id}/retry", ["POST"], queue.retry),
            ("/stats", ["GET"], queue.stats_page),
            ("/inject", ["GET"], queue.inject_page),
        ]
        routes: list[BaseRoute] = [
            Route(PREFIX + path, self._guard(fn), methods=methods) for path, methods, fn in table
        ]
        routes.append(Route(PREFIX + "/static/{name}", self.static, methods=["GET"]))
        return routes

    def _guard(self, fn: Any) -> Any:
        async def handler(request: Request) -> Response:
            try:
                return await fn(self, request)
            except Signin:
                return redirect(PREFIX + "/signin")
            except Forbidden as exc:
                return page(self, request, "error.html", 403, title="Refused", message=str(exc))
            except NotFound as exc:
                return page(self, request, "error.html", 404, title="Not found", message=str(exc))
            except InvalidTransition as exc:
                return page(
                    self, request, "error.html", 409, title="Not possible", message=str(exc)
                )
            except InvalidInput as exc:
                return page(
                    self, request, "error.html", 400, title="Not accepted", message=str(exc)
                )

        handler.__name__ = fn.__name__
        return handler

    async def static(self, request: Request) -> Response:
        found = STATIC_FILES.get(request.path_params["name"])
        if found is None or not found[1].is_file():
            return Response("not found", status_code=404, headers=SECURITY_HEADERS)
        media, path = found
        headers = {**SECURITY_HEADERS, "cache-control": "public, max-age=3600"}
        return FileResponse(path, media_type=media or "text/javascript", headers=headers)
