"""Every route that is not a chat completion: forwarded untouched, streamed both ways."""

from __future__ import annotations

import logging
import time

import anyio

from proxy.edge.identity import identity_of
from proxy.metrics import Metrics
from proxy.relay.asgi import Receive, Scope, Send, header_value
from proxy.relay.downstream import Downstream
from proxy.relay.errors import send_error
from proxy.relay.headers import replace_header, request_headers_for_upstream
from proxy.relay.stream import relay_response
from proxy.relay.timing import mark_upstream_start
from proxy.relay.upstream import Upstream, UpstreamError

log = logging.getLogger("memrelay.passthrough")

# Bodies up to this size are buffered, which makes them safe to retry.
BUFFER_LIMIT = 1024 * 1024


class Passthrough:
    """ASGI app forwarding method, path, query, headers and body as they came."""

    def __init__(self, upstream: Upstream, metrics: Metrics | None = None) -> None:
        self.upstream = upstream
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        identity_of(scope)  # fail closed: nothing is forwarded that the edge did not admit
        downstream = Downstream(receive)
        await downstream.run(lambda: self._forward(scope, downstream, send))

    async def _forward(self, scope: Scope, downstream: Downstream, send: Send) -> None:
        settings = self.upstream.settings
        headers = request_headers_for_upstream(scope["headers"])
        prefix, whole = await downstream.read_prefix(BUFFER_LIMIT)
        if whole:
            content: bytes | object = prefix
        else:
            content = downstream.rest(prefix)
            length = header_value(scope, b"content-length")
            if length is not None:
                headers = replace_header(headers, b"content-length", length)
        path = scope.get("raw_path", scope["path"].encode()).decode("latin-1").split("?", 1)[0]
        sent_at = mark_upstream_start(scope)
        deadline = anyio.current_time() + settings.total_timeout
        try:
            response = await self.upstream.open(
                scope["method"],
                path,
                scope.get("query_string", b""),
                headers,
                content,  # type: ignore[arg-type]
            )
        except UpstreamError as exc:
            await send_error(send, exc.status, exc.message, "upstream_error", exc.code)
            return
        if self.metrics is not None:
            self.metrics.ttfb.labels("passthrough").observe(time.perf_counter() - sent_at)
        try:
            await relay_response(send, response, [], deadline=deadline)
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()
        if self.metrics is not None:
            self.metrics.upstream.labels("passthrough").observe(time.perf_counter() - sent_at)
