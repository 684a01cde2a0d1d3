"""The aiohttp engine under the upstream httpx client: same wire behaviour, less event-loop time.

httpx stays the API the relay uses; only the HTTP/1.1 client under it changes (httpcore
and h11 are pure Python; aiohttp parses in C). `httpx-aiohttp` does the plumbing; this
module corrects where its transport differs from httpx's own in ways the relay relies on:

- errors become the httpx exception httpx itself raises: a disconnect or a cut body is a
  protocol error (502), a refused connection a ConnectError (502, retried), only a timeout
  is a timeout (504); the package maps every connection error to ConnectTimeout;
- the request leaves as httpx built it: header case and repeated headers kept, target not
  re-quoted, nothing added (no aiohttp Content-Type, User-Agent or `Content-Length: 0`),
  and the body sent at once under `Expect: 100-continue`;
- no cookie jar and no hidden retry: the client is shared by every tenant, and retries
  happen in `Upstream.open` only;
- an idle connection the upstream has closed is not reused (its socket is polled first,
  as httpcore does);
- one aiohttp session per event loop, created inside it on first use;
- response heads as large as h11 accepts (aiohttp stops at 8 KiB lines and 128 fields).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import httpx
from aiohttp import hdrs
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection
from httpx_aiohttp import AiohttpTransport
from multidict import CIMultiDict
from yarl import URL

# What aiohttp would add on its own: httpx has already set what it sends.
_SKIP_AUTO_HEADERS = (hdrs.ACCEPT, hdrs.ACCEPT_ENCODING, hdrs.USER_AGENT, hdrs.CONTENT_TYPE)
# h11 (httpx's parser) accepts a response head of up to 16 KiB, whatever its line count.
_MAX_HEAD = 16 * 1024


def httpx_error_for(exc: BaseException) -> type[httpx.TransportError] | None:
    """The httpx exception httpx's own transport raises for the failure aiohttp reported."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # sock_connect, or the pool wait
        return httpx.ConnectTimeout
    if isinstance(exc, aiohttp.ServerTimeoutError):  # sock_read: no byte for `read` seconds
        return httpx.ReadTimeout
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return httpx.ProxyError
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ServerFingerprintMismatch):
        return httpx.ConnectError  # refused, unresolvable, TLS handshake
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError  # "Server disconnected without sending a response."
    if isinstance(exc, aiohttp.ClientPayloadError):  # body cut short, or bad chunk framing
        return httpx.ReadError if isinstance(exc.__cause__, OSError) else httpx.RemoteProtocolError
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return httpx.UnsupportedProtocol
    if isinstance(exc, aiohttp.ClientResponseError):  # an unparsable response head
        return httpx.RemoteProtocolError
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout
    if isinstance(exc, aiohttp.ClientError | OSError):  # reset, broken pipe, closed
        return httpx.ReadError
    return None


@contextlib.contextmanager
def mapped_errors() -> Iterator[None]:
    """Re-raise aiohttp's errors as the httpx errors the relay handles."""
    try:
        yield
    except (aiohttp.ClientError, OSError) as exc:
        mapped = httpx_error_for(exc)
        if mapped is None:  # pragma: no cover - every ClientError and OSError maps
            raise
        raise mapped(str(exc) or type(exc).__name__) from exc


class _AsBuiltRequest(aiohttp.ClientRequest):
    """The request as httpx sends it: no `Content-Length: 0` on a bodiless DELETE (or any
    method outside GET/HEAD/OPTIONS/TRACE; httpx has already set it for POST, PUT and
    PATCH), and the body at once even under `Expect: 100-continue` (forwarded from the
    client; aiohttp would hold the body until a `100 Continue` some servers never send)."""

    def update_expect_continue(self, expect: bool = False) -> None:
        return None  # the header, if given, goes out as given

    def update_body_from_data(self, body: Any, *args: Any, **kwargs: Any) -> None:
        had_length = hdrs.CONTENT_LENGTH in self.headers
        super().update_body_from_data(body, *args, **kwargs)
        if body is None and not had_length:
            self.headers.popall(hdrs.CONTENT_LENGTH, None)


def _multidict(pairs: list[tuple[bytes, bytes]]) -> CIMultiDict[str]:
    """Headers for aiohttp, repeats kept: a repeat is spelt like the name's first use,
    since aiohttp keeps only the last of `X-A` and `x-a` (httpx sends both)."""
    spelling: dict[bytes, str] = {}
    headers: CIMultiDict[str] = CIMultiDict()
    for key, value in pairs:
        name = spelling.setdefault(key.lower(), key.decode("latin-1"))
        headers.add(name, value.decode("latin-1"))
    return headers


def _closed_or_unasked(protocol: ResponseHandler) -> bool:
    """Whether an idle pooled connection can no longer carry a request: its socket is
    readable (the upstream's FIN, or bytes nobody asked for) or gone. httpcore asks the
    same of every connection before reusing it."""
    transport = protocol.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.fileno() == -1:
        return True
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class _CheckedReuseConnector(aiohttp.TCPConnector):
    """aiohttp reuses a pooled connection while the loop has not yet run the callback for
    its close: an upstream that closes right after an answer turns the next request into
    "Server disconnected" (a 502). Polling the socket first, as httpcore does, catches it."""

    async def _get(self, key: Any, traces: Any) -> Connection | None:
        conns = self._conns.get(key)
        while conns and _closed_or_unasked(conns[0][0]):
            protocol, _ = conns.popleft()
            protocol.close()
        return await super()._get(key, traces)


class _ResponseStream(httpx.AsyncByteStream):
    """The raw (still encoded) body as it arrives; closing an unfinished one drops the
    connection, as httpcore does."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with mapped_errors():
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        self._response.release()
        with mapped_errors():
            await self._response.wait_for_close()


class RelayAiohttpTransport(AiohttpTransport):
    """`httpx_aiohttp.AiohttpTransport` with httpx's wire behaviour (see the module doc)."""

    def __init__(self, limits: httpx.Limits) -> None:
        super().__init__(limits=limits, trust_env=False)
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    def session(self) -> aiohttp.ClientSession:
        """This event loop's session, made on first use (a session and its pooled
        connections belong to the loop they were made in)."""
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            for other in [k for k in self._sessions if k.is_closed()]:
                self._sessions.pop(other).detach()  # its loop is gone, and its sockets too
            session = self._sessions[loop] = self._new_session()
        return session

    def _new_session(self) -> aiohttp.ClientSession:
        connector = _CheckedReuseConnector(
            limit=self.limits.max_connections or 0,  # total, like httpx's max_connections
            limit_per_host=0,
            keepalive_timeout=self.limits.keepalive_expiry,
            ssl=self.ssl_context,
        )
        session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO_HEADERS,
            request_class=_AsBuiltRequest,
            timeout=aiohttp.ClientTimeout(total=None),
            max_line_size=_MAX_HEAD,
            max_field_size=_MAX_HEAD,
            max_headers=_MAX_HEAD // 4,
        )
        # aiohttp resends an idempotent request once when the connection drops before the
        # answer; httpx does not, and the relay's retries live in Upstream.open.
        session._retry_connection = False
        return session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self.session()
        timeout = request.extensions.get("timeout", {})
        connect, pool = timeout.get("connect"), timeout.get("pool")
        pairs = request.headers.raw
        data: bytes | httpx.AsyncByteStream | None
        try:
            data = request.content or None
        except httpx.RequestNotRead:
            data = request.stream  # type: ignore[assignment]
            # aiohttp frames a stream of unknown length itself, and adds the header then.
            pairs = [(k, v) for k, v in pairs if k.lower() != b"transfer-encoding"]
        headers = _multidict(pairs)
        with mapped_errors():
            response = await session.request(
                request.method,
                URL(str(request.url), encoded=True),  # httpx has quoted it already
                headers=headers,
                data=data,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=connect,
                    sock_read=timeout.get("read"),
                    # aiohttp's `connect` spans the pool wait and the connect itself.
                    connect=None if pool is None or connect is None else pool + connect,
                ),
                server_hostname=request.extensions.get("sni_hostname"),
            )
        extensions: dict[str, Any] = {
            "http_version": f"HTTP/{response.version.major}.{response.version.minor}".encode()
        }
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode("latin-1", "replace")
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_ResponseStream(response),
            request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        """Closes this loop's session; sessions of loops already closed are dropped."""
        loop = asyncio.get_running_loop()
        for owner, session in list(self._sessions.items()):
            del self._sessions[owner]
            if owner is loop:
                await session.close()
            else:
                session.detach()
