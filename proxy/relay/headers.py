"""Which headers cross the proxy, in which direction (RFC 9110 section 7.6.1)."""

from __future__ import annotations

from collections.abc import Iterable

# Hop-by-hop headers: they describe one connection, never the exchange.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
MEMRELAY_PREFIX = b"x-memrelay-"
# The upstream client sets these from the target URL and the body it sends.
SET_BY_CLIENT = frozenset({b"host", b"content-length"})


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """Extra hop-by-hop names a `Connection` header lists."""
    names: set[bytes] = set()
    for key, value in headers:
        if key.lower() == b"connection":
            names.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return names


def request_headers_for_upstream(
    headers: Iterable[tuple[bytes, bytes]], *, keep_content_length: bool = False
) -> list[tuple[bytes, bytes]]:
    """End-to-end request headers to forward: no hop-by-hop, no X-Memrelay-*, no Host."""
    headers = list(headers)
    drop = HOP_BY_HOP | _connection_tokens(headers)
    out = []
    for key, value in headers:
        name = key.lower()
        if name in drop or name.startswith(MEMRELAY_PREFIX):
            continue
        if name in SET_BY_CLIENT and not (keep_content_length and name == b"content-length"):
            continue
        out.append((name, value))
    return out


def response_headers_for_client(
    headers: Iterable[tuple[bytes, bytes]],
) -> list[tuple[bytes, bytes]]:
    """End-to-end upstream response headers to return, content-encoding and length included."""
    headers = list(headers)
    drop = HOP_BY_HOP | _connection_tokens(headers)
    return [(k.lower(), v) for k, v in headers if k.lower() not in drop]


def replace_header(
    headers: list[tuple[bytes, bytes]], name: bytes, value: bytes | None
) -> list[tuple[bytes, bytes]]:
    """Headers with every `name` removed and, if value is given, one `name: value` appended."""
    out = [(k, v) for k, v in headers if k != name]
    if value is not None:
        out.append((name, value))
    return out
