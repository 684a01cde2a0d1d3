"""The upstream seam: one pooled httpx client, URL joining, timeouts and bounded retries.

The client speaks httpx's API over aiohttp's HTTP/1.1 engine by default
(`MEMRELAY_UPSTREAM_TRANSPORT=httpx` selects httpx's own); see aiohttp_transport.py.

Retries happen only here and only before the response is handed back, so no byte has
reached the client yet: connect errors, 429 and 502/503/504, with jittered backoff that
honours Retry-After up to a cap.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import AsyncIterable
from datetime import UTC, datetime
from http.cookiejar import CookieJar, DefaultCookiePolicy

import anyio
import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from proxy.relay.aiohttp_transport import RelayAiohttpTransport
from proxy.settings import Settings

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Parsed upstream URLs kept per process (httpx parses a URL string in ~20 us); bounded,
# since pass-through paths may carry ids.
URL_CACHE_SIZE = 64


class UpstreamError(Exception):
    """The upstream could not be reached or did not answer in time."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def upstream_root(url: str) -> str:
    """The upstream base without a trailing `/v1`, so `/v1/...` paths join without `/v1/v1`."""
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def retry_after_seconds(headers: httpx.Headers, now: float | None = None) -> float | None:
    """Seconds the upstream asked us to wait: `retry-after-ms`, then `Retry-After`."""
    if ms := headers.get("retry-after-ms"):
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now_dt = datetime.fromtimestamp(now if now is not None else time.time(), UTC)
    return max(0.0, (when - now_dt).total_seconds())


class _NoCookies(httpx.Cookies):
    """A jar that stays empty, and is never asked to: httpx would otherwise copy every
    response into urllib's cookie model only for the jar's policy to refuse it."""

    def __init__(self) -> None:
        super().__init__(CookieJar(DefaultCookiePolicy(allowed_domains=[])))  # accepts none

    def extract_cookies(self, response: httpx.Response) -> None:
        return None

    def set_cookie_header(self, request: httpx.Request) -> None:
        return None


class _RelayClient(httpx.AsyncClient):
    """httpx's client with no cookie jar to fill (see build_client)."""

    _no_cookies = _NoCookies()

    @property  # type: ignore[override]
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies

    @cookies.setter
    def cookies(self, cookies: object) -> None:
        return None  # httpx sets its jar at construction: this client keeps none


def build_client(settings: Settings) -> httpx.AsyncClient:
    """The shared upstream client: httpx's API over the configured HTTP/1.1 engine.

    No redirects, no proxy or CA settings from the environment, and no cookie jar: the
    client serves every tenant, so an upstream's Set-Cookie must never ride along on
    someone else's request (httpx keeps a jar per client by default).
    """
    timeout = httpx.Timeout(
        connect=settings.connect_timeout,
        read=settings.first_byte_timeout,
        write=settings.first_byte_timeout,
        pool=settings.connect_timeout,
    )
    limits = httpx.Limits(
        max_connections=settings.pool_connections,
        max_keepalive_connections=settings.pool_connections,
        keepalive_expiry=30,
    )
    transport = None
    if settings.upstream_transport == "aiohttp":
        transport = RelayAiohttpTransport(limits)
    return _RelayClient(
        timeout=timeout,
        limits=limits,
        transport=transport,
        follow_redirects=False,
        trust_env=False,
    )


class Upstream:
    """Sends requests to the configured upstream through one shared, pooled client."""

    def __init__(self, settings: Settings, client: httpx.AsyncClient | None = None) -> None:
        if not settings.upstream_url:
            raise ValueError("no upstream URL configured")
        self.settings = settings
        self.root = upstream_root(settings.upstream_url)
        self.client = client or build_client(settings)
        self._urls: dict[str, httpx.URL] = {}

    async def aclose(self) -> None:
        await self.client.aclose()

    def url(self, path: str, query: bytes = b"") -> str:
        url = self.root + path
        if query:
            url += "?" + query.decode("latin-1")
        return url

    def _target(self, path: str, query: bytes) -> httpx.URL:
        """`url(path, query)` parsed, from the cache when it is there."""
        url = self.url(path, query)
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = httpx.URL(url)
            if len(self._urls) < URL_CACHE_SIZE:
                self._urls[url] = parsed
        return parsed

    async def open(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        content: bytes | AsyncIterable[bytes] | None,
    ) -> httpx.Response:
        """Send a request and return the streamed response once its headers arrived.

        Byte bodies may be retried; a streamed body is sent once. The caller closes the
        response. Raises UpstreamError (502 unreachable, 504 timed out).
        """
        retryable = content is None or isinstance(content, bytes)
        attempts = self.settings.retries + 1 if retryable else 1
        request = self.client.build_request(
            method, self._target(path, query), headers=headers, content=content
        )
        try:
            try:  # the first attempt without retry machinery (tenacity's costs ~50 us)
                return await self._attempt(request, last=attempts == 1)
            except _RetryableStatus as failure:
                await anyio.sleep(
                    failure.retry_after if failure.retry_after is not None else first_backoff()
                )
            except httpx.ConnectError:
                if attempts == 1:
                    raise
                await anyio.sleep(first_backoff())
            retrying = AsyncRetrying(  # attempts 2..N; tenacity counts them from 1
                stop=stop_after_attempt(attempts - 1),
                wait=self._wait,
                retry=retry_if_exception_type((httpx.ConnectError, _RetryableStatus)),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    last = attempt.retry_state.attempt_number >= attempts - 1
                    return await self._attempt(request, last=last)
            raise AssertionError("unreachable")  # pragma: no cover (reraise=True)
        except httpx.ConnectTimeout as exc:
            raise UpstreamError(
                504, f"timed out connecting to the upstream: {exc}", "upstream_timeout"
            ) from exc
        except httpx.TimeoutException as exc:
            raise UpstreamError(
                504, "the upstream did not answer in time", "upstream_timeout"
            ) from exc
        except (
            httpx.ConnectError,
            httpx.RemoteProtocolError,
            httpx.ReadError,
            httpx.WriteError,
        ) as exc:
            raise UpstreamError(
                502, f"could not reach the upstream: {exc}", "upstream_unreachable"
            ) from exc

    async def _send(self, request: httpx.Request) -> httpx.Response:
        # asyncio's timeout, not anyio's fail_after: a fifth of the cost per request, and
        # the handler is asyncio-only anyway (uvicorn).
        try:
            async with asyncio.timeout(self.settings.first_byte_timeout):
                return await self.client.send(request, stream=True)
        except TimeoutError as exc:
            raise httpx.ReadTimeout("no response before the first-byte timeout") from exc

    async def _attempt(self, request: httpx.Request, last: bool) -> httpx.Response:
        """One attempt; a retryable status raises _RetryableStatus unless it is the last
        attempt or the upstream asks for a wait longer than `retry_max_wait`."""
        response = await self._send(request)
        if response.status_code in RETRY_STATUSES and not last:
            wait = retry_after_seconds(response.headers)
            if wait is None or wait <= self.settings.retry_max_wait:
                await response.aclose()
                raise _RetryableStatus(wait)
        return response

    def _wait(self, state: RetryCallState) -> float:
        """Before tenacity's attempt n (our n + 1): Retry-After, or the backoff after our
        attempt n (doubled multiplier: tenacity's count starts one later)."""
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _RetryableStatus) and exc.retry_after is not None:
            return exc.retry_after
        return float(wait_random_exponential(multiplier=0.5, max=4)(state))


class _RetryableStatus(Exception):
    def __init__(self, retry_after: float | None) -> None:
        super().__init__(f"retryable upstream status (retry after {retry_after})")
        self.retry_after = retry_after


def first_backoff() -> float:
    """The jittered wait after a failed first attempt: uniform in [0, 0.25] s, as
    tenacity's wait_random_exponential(multiplier=0.25) gives for attempt 1."""
    return random.uniform(0, 0.25)
