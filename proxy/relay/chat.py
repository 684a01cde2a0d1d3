"""`POST /v1/chat/completions` (also spelled `/chat/completions`) and `POST /v1/responses`:
interceptors before, byte-exact relay, exchange after. What differs between the two APIs
is in proxy/relay/apis.py.

The interceptors' `before` hooks run concurrently (each sees the request as the client
sent it until another rewrites the body; an interceptor that needs the original reads
it before its first await). Besides `before`, `response_started` and `after`, an
interceptor may define
`answer_complete(ctx, exchange)`, awaited once the whole answer is known but before its
last bytes reach the client (so whatever it records is durable by the time the client
holds the answer), and `finished(ctx)`, called when the request ends, however it ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import anyio
import httpx

from proxy.background import TaskSet
from proxy.edge.identity import SCOPE_KEY, identity_of
from proxy.metrics import Metrics
from proxy.relay.apis import CHAT_COMPLETIONS, Api
from proxy.relay.asgi import Message, Receive, Scope, Send
from proxy.relay.downstream import BodyTooLarge, Downstream
from proxy.relay.errors import send_error
from proxy.relay.exchange import Exchange
from proxy.relay.headers import replace_header, request_headers_for_upstream
from proxy.relay.hooks import CHAT_API, ChatContext, ChatInterceptor, RequestRejected, wants_answer
from proxy.relay.json_input import BadJSON
from proxy.relay.stream import DecodingTap, relay_response
from proxy.relay.template_fallback import (
    TemplateFallback,
    names_system_role,
    read_small_error,
    replayable,
)
from proxy.relay.timing import mark_upstream_start, request_id
from proxy.relay.upstream import Upstream, UpstreamError

log = logging.getLogger("memrelay.chat")

# A plain JSON answer larger than this is relayed but not parsed for the exchange hook.
JSON_TAP_LIMIT = 32 * 1024 * 1024


class ChatCompletions:
    """ASGI app for one memory API (chat completions by default, or the Responses API);
    every other method on the path passes through."""

    def __init__(
        self,
        upstream: Upstream,
        interceptors: list[ChatInterceptor],
        tasks: TaskSet,
        metrics: Metrics | None = None,
        api: Api = CHAT_COMPLETIONS,
        template: TemplateFallback | None = None,
    ) -> None:
        self.upstream = upstream
        self.interceptors = interceptors
        self.tasks = tasks
        self.metrics = metrics
        self.api = api
        self.template = template or TemplateFallback(enabled=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        downstream = Downstream(receive)
        contexts: list[ChatContext] = []
        try:
            await downstream.run(lambda: self._handle(scope, downstream, send, contexts))
        finally:
            for ctx in contexts:
                self._finished(ctx)

    async def _before(self, ctx: ChatContext) -> None:
        """Every interceptor's `before`, side by side: recall's wait and learning's draft
        write overlap instead of adding up before the request goes upstream. Each runs to
        its end (a draft written is then on the context, for `finished` to drop); the
        first error in interceptor order is raised."""
        scope = ctx.state.get(SCOPE_KEY)
        if len(self.interceptors) == 1 or not (scope.reads and scope.writes):
            # at most one of recall and learning has work: no tasks to pay for
            for interceptor in self.interceptors:
                await interceptor.before(ctx)
            return
        outcomes = await asyncio.gather(
            *(interceptor.before(ctx) for interceptor in self.interceptors),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    def _finished(self, ctx: ChatContext) -> None:
        for interceptor in self.interceptors:
            finished = getattr(interceptor, "finished", None)
            if finished is not None:
                try:
                    finished(ctx)
                except Exception:
                    log.exception("an interceptor failed at the end of request %s", ctx.request_id)

    async def _answer_complete(self, ctx: ChatContext, exchange: Exchange) -> None:
        for interceptor in self.interceptors:
            complete = getattr(interceptor, "answer_complete", None)
            if complete is not None:
                await complete(ctx, exchange)

    async def _handle(
        self, scope: Scope, downstream: Downstream, send: Send, contexts: list[ChatContext]
    ) -> None:
        settings = self.upstream.settings
        deadline = anyio.current_time() + settings.total_timeout
        try:
            raw = await downstream.read_body(settings.max_body_bytes)
        except BodyTooLarge:
            await send_error(
                send,
                413,
                f"request body exceeds {settings.max_body_bytes} bytes",
                code="body_too_large",
            )
            return
        try:
            body = self.api.parse(raw)
        except BadJSON as exc:
            await send_error(send, 400, str(exc), code="invalid_body")
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        ctx = ChatContext(
            request_id=request_id(scope),
            headers=headers,
            body=body,
            api=self.api.name,
            placement=self.template.placement_for(body.get("model")),
        )
        ctx.state[SCOPE_KEY] = identity_of(scope).memory  # decided once, at the edge
        contexts.append(ctx)
        try:
            await self._before(ctx)
        except RequestRejected as exc:
            await send_error(send, exc.status, exc.message, code=exc.code, param=exc.param)
            return
        if ctx.body_changed:
            raw = _dumps(ctx.body)
        up_headers = request_headers_for_upstream(scope["headers"])
        # Ask for an uncompressed answer so the side parser reads what the client reads.
        up_headers = replace_header(up_headers, b"accept-encoding", b"identity")
        sent_at = mark_upstream_start(scope)
        query = scope.get("query_string", b"")
        path = self.api.upstream_path
        try:
            response = await self.upstream.open("POST", path, query, up_headers, raw)
            if ctx.api == CHAT_API and self.template.may_retry(
                response.status_code, ctx.inserted_message
            ):
                response = await self._template_fallback(ctx, response, query, up_headers)
        except UpstreamError as exc:
            self._response_started(ctx, exc.status)
            await send_error(
                send,
                exc.status,
                exc.message,
                "upstream_error",
                exc.code,
                headers=ctx.response_headers,
            )
            return
        if self.metrics is not None:
            self.metrics.ttfb.labels(self.api.metric).observe(time.perf_counter() - sent_at)
        self._response_started(ctx, response.status_code)
        try:
            exchange = await self._relay(send, response, ctx, deadline)
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()
        if self.metrics is not None:
            self.metrics.upstream.labels(self.api.metric).observe(time.perf_counter() - sent_at)
        if exchange is not None:
            self._after(ctx, exchange)

    async def _template_fallback(
        self, ctx: ChatContext, response: Any, query: bytes, headers: list[tuple[bytes, bytes]]
    ) -> Any:
        """A 400 to a request where memrelay added a system message: if it names the
        system role, send the request once more with the memory in the first user
        message, and remember that model. Nothing has reached the client yet."""
        try:
            error = await read_small_error(response)
        except httpx.HTTPError as exc:
            await response.aclose()
            raise UpstreamError(
                502, f"could not read the upstream: {exc}", "upstream_unreachable"
            ) from exc
        if error is None:  # too large or compressed to be a template error: relay it
            return response
        await response.aclose()
        if not names_system_role(error):
            return replayable(response, error)
        self.template.remember(ctx.body.get("model"))
        if not ctx.reinject("user") or ctx.inserted_message:
            return replayable(response, error)  # no user turn to carry the memory
        log.info("request %s: retried with the memory in the user turn", ctx.request_id)
        return await self.upstream.open(
            "POST", self.api.upstream_path, query, headers, _dumps(ctx.body)
        )

    def _after(self, ctx: ChatContext, exchange: Exchange) -> None:
        """Hand the finished exchange to the interceptors, in the background."""
        for interceptor in self.interceptors:
            self.tasks.spawn(interceptor.after(ctx, exchange), name="exchange-hook")

    def _response_started(self, ctx: ChatContext, status: int) -> None:
        for interceptor in self.interceptors:
            interceptor.response_started(ctx, status)

    async def _relay(
        self, send: Send, response: Any, ctx: ChatContext, deadline: float
    ) -> Exchange | None:
        """Relay the answer; return the assembled exchange if it succeeded."""
        success = 200 <= response.status_code < 300
        streamed = "text/event-stream" in response.headers.get("content-type", "")
        exchange = Exchange(
            request=ctx.body,
            request_headers=ctx.headers,
            status=response.status_code,
            streamed=streamed,
            request_id=ctx.request_id,
        )
        if not success or not any(wants_answer(i, ctx) for i in self.interceptors):
            await relay_response(send, response, ctx.response_headers, deadline=deadline)
            return None
        if streamed:
            assembler = self.api.assembler(exchange)
            tap = DecodingTap(response.headers.get("content-encoding"), assembler.feed)
            finished = False

            async def send_stream(message: Message) -> None:
                # The tap has read this chunk already: if it completed the answer, the
                # interceptors record it before the client can see the end of it.
                nonlocal finished
                if not finished and tap.supported and exchange.complete:
                    finished = True
                    await self._answer_complete(ctx, exchange)
                await send(message)

            try:
                await relay_response(send_stream, response, ctx.response_headers, tap, deadline)
            except BaseException:
                # A client that read `[DONE]` may hang up before the stream's last empty
                # frame is written; the answer it got was whole, so it still counts.
                if tap.supported and exchange.done:
                    assembler.close()
                    self._after(ctx, exchange)
                raise
            if not tap.supported:
                return None
            assembler.close()
            return exchange
        buffer = bytearray()

        def collect(chunk: bytes) -> None:
            if len(buffer) <= JSON_TAP_LIMIT:
                buffer.extend(chunk)

        tap = DecodingTap(response.headers.get("content-encoding"), collect)
        held: list[Message] = []
        result: list[Exchange] = []

        async def send_json(message: Message) -> None:
            # One chunk is held back, so the answer can be parsed and recorded before its
            # last bytes reach the client (same total time; a JSON answer is not streamed).
            if message["type"] != "http.response.body":
                await send(message)
                return
            if message.get("more_body", False):
                if held:
                    await send(held.pop())
                held.append(message)
                return
            parsed = self._parse_answer(exchange, buffer, tap.supported)
            if parsed is not None:
                result.append(parsed)
                await self._answer_complete(ctx, parsed)
            for pending in held:
                await send(pending)
            held.clear()
            await send(message)

        await relay_response(send_json, response, ctx.response_headers, tap, deadline)
        return result[0] if result else None

    def _parse_answer(
        self, exchange: Exchange, buffer: bytearray, supported: bool
    ) -> Exchange | None:
        if not supported or len(buffer) > JSON_TAP_LIMIT:
            return None
        try:
            parsed = json.loads(bytes(buffer))
        except ValueError:
            log.warning("upstream answered 2xx with a body that is not JSON; no exchange")
            return None
        if not isinstance(parsed, dict):
            return None
        return self.api.assemble_json(exchange, parsed)


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
