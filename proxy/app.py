"""The Starlette application: routes, lifespan and the shared upstream client."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from proxy.auth import AuthMiddleware
from proxy.background import TaskSet
from proxy.chat import ChatCompletions
from proxy.hooks import ChatInterceptor
from proxy.keys import KeyStore
from proxy.metrics import Metrics
from proxy.passthrough import Passthrough
from proxy.settings import Settings
from proxy.timing import TimingMiddleware
from proxy.upstream import Upstream

log = logging.getLogger("memrelay.app")


class Resource(Protocol):
    """Something started with the app and closed when it stops (the store, workers)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def create_app(
    settings: Settings,
    interceptors: list[ChatInterceptor] | None = None,
    upstream_client: httpx.AsyncClient | None = None,
    resources: list[Resource] | None = None,
    routes: list[BaseRoute] | None = None,
    metrics: Metrics | None = None,
    keys: KeyStore | None = None,
    readiness: Callable[[], Awaitable[tuple[bool, dict[str, Any]]]] | None = None,
) -> TimingMiddleware:
    """Build the ASGI app; `interceptors` plug memory into chat completions, `resources`
    are started in order before the first request and closed in reverse after the last."""
    upstream = Upstream(settings, upstream_client)
    tasks = TaskSet()
    chat = ChatCompletions(upstream, list(interceptors or []), tasks, metrics)
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
            Route("/{path:path}", passthrough),
        ],
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.upstream = upstream
    app.state.tasks = tasks
    guarded = AuthMiddleware(
        app, keys or KeyStore(None), settings.default_tenant, settings.upstream_api_key
    )
    return TimingMiddleware(guarded, metrics)
