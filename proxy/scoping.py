"""The memory scope of a request, from its X-Memrelay-* headers. Malformed is a 400."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from proxy.hooks import ChatContext, RequestRejected
from proxy.settings import Settings

Mode = Literal["on", "off", "read", "write"]
MODES: tuple[str, ...] = ("on", "off", "read", "write")
_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_ID_RULE = "1 to 128 characters of A-Z a-z 0-9 . _ : -"

TENANT = "x-memrelay-tenant"
WRITE_SPACE = "x-memrelay-write-space"
READ_SPACES = "x-memrelay-read-spaces"
MEMORY = "x-memrelay-memory"


@dataclass(frozen=True)
class MemoryScope:
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


def _bad(header: str, problem: str) -> RequestRejected:
    name = "-".join(part.capitalize() for part in header.split("-"))
    return RequestRejected(400, f"{name}: {problem}", param=name, code="invalid_memrelay_header")


def _id(headers: dict[str, str], header: str, default: str) -> str:
    value = headers.get(header)
    if value is None:
        return default
    value = value.strip()
    if not _ID.fullmatch(value):
        raise _bad(header, f"must be {_ID_RULE} (got {value[:64]!r})")
    return value


def scope_from_headers(
    headers: dict[str, str], default_tenant: str, max_read_spaces: int
) -> MemoryScope:
    """Headers (lower-case names) to a validated scope; raises RequestRejected(400)."""
    tenant = _id(headers, TENANT, default_tenant)
    write_space = _id(headers, WRITE_SPACE, "default")
    raw = headers.get(READ_SPACES)
    if raw is None:
        read_spaces: tuple[str, ...] = (write_space,)
    else:
        spaces: list[str] = []
        for part in raw.split(","):
            part = part.strip()
            if not _ID.fullmatch(part):
                raise _bad(
                    READ_SPACES,
                    f"each space must be {_ID_RULE} (got {part[:64]!r})",
                )
            if part not in spaces:
                spaces.append(part)
        if len(spaces) > max_read_spaces:
            raise _bad(READ_SPACES, f"at most {max_read_spaces} spaces (got {len(spaces)})")
        read_spaces = tuple(spaces)
    mode = headers.get(MEMORY, "on").strip().lower()
    if mode not in MODES:
        raise _bad(MEMORY, f"must be one of {', '.join(MODES)} (got {mode[:32]!r})")
    return MemoryScope(tenant, write_space, read_spaces, mode)


def scope_for(ctx: ChatContext, settings: Settings) -> MemoryScope:
    """The request's scope, parsed once and kept on the context."""
    scope = ctx.state.get("memory_scope")
    if scope is None:
        scope = scope_from_headers(ctx.headers, settings.default_tenant, settings.max_read_spaces)
        ctx.state["memory_scope"] = scope
    return scope
