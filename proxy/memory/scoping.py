"""The memory scope of a request: which tenant, which space it writes, which it reads.

It is parsed from the X-Memrelay-* headers once, at the edge (proxy/edge/identity.py), and
only read here: `scope_for` hands the chat interceptors the scope the edge decided, and
raises if there is none. The scope type lives beside the identity, so the relay and the
edge never import the memory layer. Nothing in this module reads a header.
"""

from __future__ import annotations

from proxy.edge.identity import MODES, SCOPE_KEY, MemoryScope, Mode
from proxy.relay.hooks import ChatContext
from proxy.settings import Settings

__all__ = ["MODES", "SCOPE_KEY", "MemoryScope", "Mode", "ScopeMissing", "scope_for"]


class ScopeMissing(RuntimeError):
    """A chat context reached an interceptor without the scope the edge decided."""


def scope_for(ctx: ChatContext, settings: Settings | None = None) -> MemoryScope:
    """The request's scope, as the edge decided it (put on the context by the chat route)."""
    scope = ctx.state.get(SCOPE_KEY)
    if not isinstance(scope, MemoryScope):
        raise ScopeMissing("the chat context carries no memory scope from the edge")
    return scope
