"""Who a request is: decided once, at the edge, and read from the ASGI scope by everyone.

The edge middleware (proxy/edge/auth.py) parses the key, the tenant, the spaces and the memory
mode from the request headers exactly once, removes every `X-Memrelay-*` header from
the scope, and stores one frozen `Identity` in `scope["state"]`. Consumers (chat, pass
through, admin API, metrics, logs) call `identity_of(scope)`, which raises when the edge
did not run: a route added later cannot quietly read raw headers instead, because they
are gone, and it cannot run without a decision, because the accessor refuses.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

STATE_KEY = "memrelay_identity"
ID_RULE = "1 to 128 characters of A-Z a-z 0-9 . _ : -"
_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

KEY = b"x-memrelay-key"
TENANT = b"x-memrelay-tenant"
WRITE_SPACE = b"x-memrelay-write-space"
READ_SPACES = b"x-memrelay-read-spaces"
MEMORY = b"x-memrelay-memory"
TENANT_PARAM = "X-Memrelay-Tenant"
KNOWN = frozenset({KEY, TENANT, WRITE_SPACE, READ_SPACES, MEMORY})
MEMRELAY_PREFIX = b"x-memrelay-"
AUTHORIZATION = b"authorization"


Mode = Literal["on", "off", "read", "write"]
MODES: tuple[str, ...] = ("on", "off", "read", "write")
SCOPE_KEY = "memory_scope"  # where the chat route puts the scope on the chat context


@dataclass(frozen=True, slots=True)
class MemoryScope:
    """Which tenant a request is, which space it writes and which it reads (the edge decides)."""

    tenant: str
    write_space: str
    read_spaces: tuple[str, ...]
    mode: str

    @property
    def reads(self) -> bool:
        return self.mode in ("on", "read")

    @property
    def writes(self) -> bool:
        return self.mode in ("on", "write")


# For log lines: the key id and tenant of the request being served ("-" outside one).
LOG_FIELDS: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar(
    "memrelay_identity", default=("-", "-")
)


class IdentityMissing(RuntimeError):
    """A consumer asked who a request is, but the edge middleware never decided it."""


class BadRequestHeaders(Exception):
    """The memrelay headers of a request are repeated, unknown or malformed (a 400)."""

    def __init__(self, message: str, param: str | None, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class Identity:
    """The edge's decision: the key (None when memrelay runs open) and the memory scope."""

    key_id: str | None
    admin: bool
    memory: MemoryScope
    tenant_given: bool

    @property
    def tenant(self) -> str:
        return self.memory.tenant


@dataclass(frozen=True, slots=True)
class ParsedHeaders:
    """The memrelay part of a request's headers, parsed once; the rest, to keep."""

    key: str | None
    bearer: str | None
    memory: MemoryScope
    tenant_given: bool
    kept: list[tuple[bytes, bytes]]


def identity_of(scope: object) -> Identity:
    """The identity the edge decided for this request; raises if there is none."""
    try:
        found = scope["state"][STATE_KEY]  # type: ignore[index]
    except (KeyError, TypeError) as exc:
        raise IdentityMissing("no identity in the request scope: is the edge on?") from exc
    if not isinstance(found, Identity):
        raise IdentityMissing("the request scope holds something else than an Identity")
    return found


def _title(name: bytes) -> str:
    return "-".join(part.capitalize() for part in name.decode("latin-1").split("-"))


def _bad(name: bytes, problem: str) -> BadRequestHeaders:
    return BadRequestHeaders(f"{_title(name)}: {problem}", _title(name), "invalid_memrelay_header")


def _id(raw: bytes | None, name: bytes, default: str) -> str:
    if raw is None:
        return default
    value = raw.decode("latin-1").strip()
    if not _ID.fullmatch(value):
        raise _bad(name, f"must be {ID_RULE} (got {value[:64]!r})")
    return value


_BEARER = re.compile(rb"^\s*bearer\s+(\S+)\s*$", re.IGNORECASE)


def parse_headers(
    headers: Iterable[tuple[bytes, bytes]], default_tenant: str, max_read_spaces: int
) -> ParsedHeaders:
    """One pass over the raw headers: memrelay ones parsed (each at most once), the rest kept.

    Raises BadRequestHeaders for a repeated memrelay header or Authorization, an unknown
    `X-Memrelay-*` request header, or a malformed value.
    """
    found: dict[bytes, bytes] = {}
    kept: list[tuple[bytes, bytes]] = []
    authorization: bytes | None = None
    for name, value in headers:
        lower = name.lower()
        if lower.startswith(MEMRELAY_PREFIX):
            if lower not in KNOWN:
                raise BadRequestHeaders(
                    f"unknown request header {_title(lower)}; memrelay reads "
                    + ", ".join(sorted(_title(k) for k in KNOWN)),
                    _title(lower),
                    "unknown_memrelay_header",
                )
            if lower in found:
                raise BadRequestHeaders(
                    f"{_title(lower)} was sent more than once; send it once",
                    _title(lower),
                    "repeated_header",
                )
            found[lower] = value
            continue
        if lower == AUTHORIZATION:
            if authorization is not None:
                raise BadRequestHeaders(
                    "Authorization was sent more than once; send it once",
                    "Authorization",
                    "repeated_header",
                )
            authorization = value
        kept.append((name, value))
    tenant_raw = found.get(TENANT)
    tenant = _id(tenant_raw, TENANT, default_tenant)
    write_space = _id(found.get(WRITE_SPACE), WRITE_SPACE, "default")
    raw_spaces = found.get(READ_SPACES)
    if raw_spaces is None:
        read_spaces: tuple[str, ...] = (write_space,)
    else:
        spaces: list[str] = []
        for part in raw_spaces.decode("latin-1").split(","):
            part = part.strip()
            if not _ID.fullmatch(part):
                raise _bad(READ_SPACES, f"each space must be {ID_RULE} (got {part[:64]!r})")
            if part not in spaces:
                spaces.append(part)
        if len(spaces) > max_read_spaces:
            raise _bad(READ_SPACES, f"at most {max_read_spaces} spaces (got {len(spaces)})")
        read_spaces = tuple(spaces)
    mode = found.get(MEMORY, b"on").decode("latin-1").strip().lower()
    if mode not in MODES:
        raise _bad(MEMORY, f"must be one of {', '.join(MODES)} (got {mode[:32]!r})")
    key_raw = found.get(KEY)
    key = key_raw.decode("latin-1").strip() if key_raw is not None else None
    match = _BEARER.match(authorization) if authorization is not None else None
    bearer = match.group(1).decode("latin-1") if match else None
    return ParsedHeaders(
        key=key or None,
        bearer=bearer,
        memory=MemoryScope(tenant, write_space, read_spaces, mode),
        tenant_given=tenant_raw is not None,
        kept=kept,
    )
