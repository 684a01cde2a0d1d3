"""Pure ASGI middleware: a request id and `X-Memrelay-Overhead-Ms` on every response.

Overhead is the time spent inside memrelay before the request left for the upstream;
handlers stamp it with `mark_upstream_start`. Responses that never went upstream report
the whole time spent in memrelay.
"""

from __future__ import annotations

import contextvars
import time
import uuid

from proxy.metrics import Metrics, route_of
from proxy.relay.asgi import ASGIApp, Message, Receive, Scope, Send

_T0 = "memrelay_t0"
_OVERHEAD = "memrelay_overhead_ms"
REQUEST_ID = "memrelay_request_id"
REQUEST_ID_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def mark_upstream_start(scope: Scope) -> float:
    """Record that the request is leaving for the upstream now; returns the clock."""
    now = time.perf_counter()
    state = scope.setdefault("state", {})
    state[_OVERHEAD] = (now - state.get(_T0, now)) * 1000
    return now


def request_id(scope: Scope) -> str:
    return scope.get("state", {}).get(REQUEST_ID, "")


class TimingMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics | None = None) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state[_T0] = time.perf_counter()
        state[REQUEST_ID] = uuid.uuid4().hex
        token = REQUEST_ID_VAR.set(state[REQUEST_ID])

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = route_of(scope["path"])  # the path as the edge normalised it
                overhead = state.get(_OVERHEAD)
                if overhead is None:
                    overhead = (time.perf_counter() - state[_T0]) * 1000
                elif self.metrics is not None:
                    self.metrics.overhead.labels(route).observe(overhead / 1000)
                if self.metrics is not None:
                    self.metrics.requests.labels(
                        route, scope["method"], str(message["status"])
                    ).inc()
                headers = list(message.get("headers", []))
                headers.append((b"x-memrelay-overhead-ms", f"{overhead:.2f}".encode()))
                headers.append((b"x-memrelay-request-id", state[REQUEST_ID].encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            REQUEST_ID_VAR.reset(token)
