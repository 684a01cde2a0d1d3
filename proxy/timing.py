"""Pure ASGI middleware: a request id and `X-Memrelay-Overhead-Ms` on every response.

Overhead is the time spent inside memrelay before the request left for the upstream;
handlers stamp it with `mark_upstream_start`. Responses that never went upstream report
the whole time spent in memrelay.
"""

from __future__ import annotations

import time
import uuid

from proxy.asgi import ASGIApp, Message, Receive, Scope, Send

_T0 = "memrelay_t0"
_OVERHEAD = "memrelay_overhead_ms"
REQUEST_ID = "memrelay_request_id"


def mark_upstream_start(scope: Scope) -> None:
    """Record that the request is leaving for the upstream now."""
    state = scope.setdefault("state", {})
    state[_OVERHEAD] = (time.perf_counter() - state.get(_T0, time.perf_counter())) * 1000


def request_id(scope: Scope) -> str:
    return scope.get("state", {}).get(REQUEST_ID, "")


class TimingMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state[_T0] = time.perf_counter()
        state[REQUEST_ID] = uuid.uuid4().hex

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                overhead = state.get(_OVERHEAD)
                if overhead is None:
                    overhead = (time.perf_counter() - state[_T0]) * 1000
                headers = list(message.get("headers", []))
                headers.append((b"x-memrelay-overhead-ms", f"{overhead:.2f}".encode()))
                headers.append((b"x-memrelay-request-id", state[REQUEST_ID].encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed_send)
