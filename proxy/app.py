"""The Starlette application: routes, lifespan and the shared upstream client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Scope

from proxy.background import TaskSet
from proxy.edge.auth import AuthMiddleware, BrowserSessions
from proxy.edge.keys import KeyStore
from proxy.metrics import Metrics
from proxy.relay.apis import CHAT_COMPLETIONS, RESPONSES
from proxy.relay.chat import ChatCompletions
from proxy.relay.errors import error_body
from proxy.relay.hooks import ChatInterceptor
from proxy.relay.passthrough import Passthrough
from proxy.relay.paths import MEMRELAY
from proxy.relay.template_fallback import TemplateFallback
from proxy.relay.timing import TimingMiddleware
from proxy.relay.upstream import Upstream
from proxy.settings import Settings

log = logging.getLogger("memrelay.app")


def watch_sighup(keys: KeyStore) -> None:
    """SIGHUP re-reads the keys file (edits are also noticed without it)."""
    if keys.path is None or not hasattr(signal, "SIGHUP"):
        return

    def reload() -> None:
        try:
            keys.reload()
            log.info("keys file reloaded on SIGHUP")
        except ValueError as exc:
            log.warning("SIGHUP: keys file not reloaded, keeping the old keys: %s", exc)

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
    except (RuntimeError, ValueError, NotImplementedError):
        log.debug("SIGHUP not watched (not the main thread); file edits still reload keys")


class Resource(Protocol):
    """Something started with the app and closed when it stops (the store, workers)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class ForwardedRoute(Route):
    """The pass-through route: matches every path the edge let through, except memrelay's
    own, so an unknown /memrelay path is a 404 and a wrong method on one a 405."""

    def __init__(self, app: Passthrough) -> None:
        super().__init__("/{path:path}", app)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http" or scope["path"].startswith(MEMRELAY):
            return Match.NONE, {}
        return super().matches(scope)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405 in the OpenAI error shape."""
    assert isinstance(exc, HTTPException)
    code = {404: "route_not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = {
        404: f"no route {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    return Response(
        error_body(message, "invalid_request_error", code),
        status_code=exc.status_code,
        headers=dict(exc.headers or {}),
        media_type="application/json",
    )


def create_app(
    settings: Settings,
    interceptors: list[ChatInterceptor] | None = None,
    upstream_client: httpx.AsyncClient | None = None,
    resources: list[Resource] | None = None,
    routes: list[BaseRoute] | None = None,
    metrics: Metrics | None = None,
    keys: KeyStore | None = None,
    readiness: Callable[[], Awaitable[tuple[bool, dict[str, Any]]]] | None = None,
    browser: BrowserSessions | None = None,
) -> TimingMiddleware:
    """Build the ASGI app; `interceptors` plug memory into chat completions, `resources`
    are started in order before the first request and closed in reverse after the last."""
    upstream = Upstream(settings, upstream_client)
    key_store = keys if keys is not None else KeyStore(settings.keys_file, must_exist=True)
    tasks = TaskSet()
    template = TemplateFallback(settings.memory_placement, settings.memory_placement_fallback)
    chat = ChatCompletions(
        upstream, list(interceptors or []), tasks, metrics, CHAT_COMPLETIONS, template
    )
    responses = ChatCompletions(upstream, list(interceptors or []), tasks, metrics, RESPONSES)
    passthrough = Passthrough(upstream, metrics)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        try:
            response = await upstream.client.get(upstream.url("/v1/models"), timeout=5.0)
        except httpx.HTTPError as exc:
            return JSONResponse(
                {"status": "unavailable", "upstream": upstream.root, "error": type(exc).__name__},
                status_code=503,
            )
        body: dict[str, Any] = {
            "status": "ready",
            "upstream": upstream.root,
            "upstream_status": response.status_code,
        }
        if readiness is not None:  # the learning loop: workers alive, backlog, oldest job
            ready, body["learning"] = await readiness()
            if not ready:
                return JSONResponse({**body, "status": "unavailable"}, status_code=503)
        return JSONResponse(body)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        started: list[Resource] = []
        watch_sighup(key_store)
        try:
            for resource in resources or []:
                await resource.start()
                started.append(resource)
            yield
        finally:
            await tasks.drain()
            for resource in reversed(started):
                await resource.close()
            await upstream.aclose()

    app = Starlette(
        routes=[
            Route("/memrelay/healthz", healthz, methods=["GET"]),
            Route("/memrelay/readyz", readyz, methods=["GET"]),
            *(routes or []),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),  # a base_url without /v1
            Route("/v1/responses", responses, methods=["POST"]),
            ForwardedRoute(passthrough),
        ],
        lifespan=lifespan,
        exception_handlers={404: http_error, 405: http_error},
    )
    app.state.settings = settings
    app.state.upstream = upstream
    app.state.tasks = tasks
    guarded = AuthMiddleware(app, key_store, settings, browser)
    return TimingMiddleware(guarded, metrics)
