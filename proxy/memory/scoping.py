"""The memory scope of a request: which tenant, which space it writes, which it reads.

It is parsed from the X-Memrelay-* headers once, at the edge (proxy/edge/identity.py), and
only read here: `scope_for` hands the chat interceptors the scope the edge decided, and
raises if there is none. Nothing in this module reads a header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.relay.hooks import ChatContext
from proxy.settings import Settings

Mode = Literal["on", "off", "read", "write"]
MODES: tuple[str, ...] = ("on", "off", "read", "write")
SCOPE_KEY = "memory_scope"


@dataclass(frozen=True, slots=True)
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


class ScopeMissing(RuntimeError):
    """A chat context reached an interceptor without the scope the edge decided."""


def scope_for(ctx: ChatContext, settings: Settings | None = None) -> MemoryScope:
    """The request's scope, as the edge decided it (put on the context by the chat route)."""
    scope = ctx.state.get(SCOPE_KEY)
    if not isinstance(scope, MemoryScope):
        raise ScopeMissing("the chat context carries no memory scope from the edge")
    return scope
