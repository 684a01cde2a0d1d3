"""The MCP server: a tenant's memory as tools for agents (recall, remember, correct,
forget, list, history), built with the official `mcp` SDK.

Who a call is never comes from its arguments. Over streamable HTTP (/memrelay/mcp, see
proxy/admin/mcp_http.py) it is the edge's decision for the HTTP request that carried the
call, read with `identity_of` (key, tenant, spaces and memory mode, decided once in
proxy/edge/auth.py); over stdio (`memrelay mcp`) it is fixed by the command line. A tool
call with any argument a tool does not declare (a `tenant`, a `space`) is refused, so an
agent learns it cannot choose. Every tool reads and writes through the same operations as
the admin API (proxy/admin/memory_ops.py), within the connection's spaces: it reads its
read spaces, writes its write space, and corrects only what lives there.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field, ValidationError

from extraction.reconcile import Reconciler
from memory_core.errors import InvalidInput, InvalidTransition, NotFound
from memory_core.model import STATUSES, NewMemory
from memory_core.standing_rules import StandingPolicy
from memory_core.store import ListQuery, MemoryStore
from proxy.admin import memory_ops as ops
from proxy.admin.models import ForgetBody, KindName, RecallBody, RememberBody
from proxy.edge.identity import IdentityMissing, identity_of
from proxy.memory.scoping import MemoryScope
from proxy.relay.timing import request_id
from proxy.storage import storage_full

NAME = "memrelay"
INSTRUCTIONS = (
    "Long-term memory for this user or team. Call `recall` before answering anything that "
    "may depend on what was said before; `remember` durable facts, preferences, "
    "constraints and mistakes to avoid; `correct` a memory that is no longer right "
    "(the old version stays in its history); `forget` with dry_run=true first, then "
    "dry_run=false once the user confirms. The tenant and spaces are fixed by this "
    "connection, not by arguments."
)
MAX_LIST = 1000


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a tool call is: the memory scope, and the key and request for provenance."""

    scope: MemoryScope
    key_id: str | None
    request_id: str | None
    via: str  # "mcp-http" or "mcp-stdio"


CallerOf = Callable[[Context], Caller]
Ready = Callable[[], Awaitable[None]]  # awaited before a tool touches the store


def http_caller(ctx: Context) -> Caller:
    """The edge's decision for the HTTP request that carried this call; raises without one
    (a call that did not cross the edge has no identity, never a default one)."""
    request = ctx.request_context.request
    if request is None:
        raise IdentityMissing("an MCP call over HTTP arrived without its HTTP request")
    identity = identity_of(request.scope)
    return Caller(identity.memory, identity.key_id, request_id(request.scope) or None, "mcp-http")


def fixed_caller(scope: MemoryScope) -> CallerOf:
    """One scope for every call: stdio, where the command line decided it."""
    caller = Caller(scope, None, None, "mcp-stdio")
    return lambda ctx: caller


@contextlib.contextmanager
def tool_errors() -> Iterator[None]:
    """Library errors as tool errors the model can read (and act on)."""
    try:
        yield
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        raise ToolError(f"invalid arguments: {problems}") from exc
    except (NotFound, InvalidInput, InvalidTransition) as exc:
        raise ToolError(str(exc)) from exc
    except Exception as exc:
        if storage_full(exc):
            raise ToolError("the memory database's disk is full; nothing was written") from exc
        raise


def _provenance(caller: Caller) -> dict[str, Any]:
    found: dict[str, Any] = {"via": caller.via, "time": time.time()}
    if caller.key_id:
        found["key_id"] = caller.key_id
    if caller.request_id:
        found["request_id"] = caller.request_id
    return found


def _by(caller: Caller) -> str:
    """Fixed words and ids for reasons: never what the agent wrote."""
    parts = [caller.via]
    if caller.key_id:
        parts.append(f"key {caller.key_id}")
    if caller.request_id:
        parts.append(f"request {caller.request_id}")
    return ", ".join(parts)


class MemoryTools:
    """The six tools over one store; `caller_of` says who each call is."""

    def __init__(
        self,
        store: MemoryStore,
        reconciler: Reconciler,
        caller_of: CallerOf,
        ready: Ready | None = None,
        standing: StandingPolicy | None = None,
    ) -> None:
        self.store = store
        self.standing = standing
        self.reconciler = reconciler
        self.caller_of = caller_of
        self.ready = ready
        self.allowed: dict[str, frozenset[str]] = {}

    async def begin(self, ctx: Context, *, reads: bool = False, writes: bool = False) -> Caller:
        """Refuse undeclared arguments, decide who the call is and whether its memory mode
        (X-Memrelay-Memory or --memory) lets it read or write, then wait for the store."""
        params = ctx.request_context.params or {}
        name = str(params.get("name", ""))
        unknown = sorted(set(params.get("arguments") or {}) - self.allowed.get(name, frozenset()))
        if unknown:
            raise ToolError(
                f"unknown argument(s) {', '.join(map(repr, unknown))} for {name}: the tenant "
                "and spaces come from this connection (its key and headers), not from arguments"
            )
        caller = self.caller_of(ctx)
        if reads and not caller.scope.reads:
            raise ToolError(f"memory mode is {caller.scope.mode!r}: this connection may not read")
        if writes and not caller.scope.writes:
            raise ToolError(f"memory mode is {caller.scope.mode!r}: this connection may not write")
        if self.ready is not None:
            await self.ready()
        return caller

    def register(self, server: MCPServer) -> None:
        read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)
        tools: list[tuple[Callable[..., Any], str, ToolAnnotations]] = [
            (self.recall, "recall", read_only),
            (self.remember, "remember", ToolAnnotations(open_world_hint=False)),
            (self.correct, "correct", ToolAnnotations(open_world_hint=False)),
            (
                self.forget,
                "forget",
                ToolAnnotations(destructive_hint=True, open_world_hint=False),
            ),
            (self.list_memories, "list", read_only),
            (self.history, "history", read_only),
        ]
        for fn, name, hints in tools:
            server.add_tool(fn, name=name, annotations=hints)
            params = inspect.signature(fn).parameters
            self.allowed[name] = frozenset(p for p in params if p != "ctx")

    async def recall(
        self,
        ctx: Context,
        query: Annotated[str, Field(description="What to look for, in plain words.")],
        top_k: Annotated[int, Field(description="At most this many memories (1-100).")] = 10,
        kinds: Annotated[
            list[KindName] | None, Field(description="Only these kinds (default: all).")
        ] = None,
        min_similarity: Annotated[
            float, Field(description="Leave out memories less similar than this (-1 to 1).")
        ] = -1.0,
    ) -> dict[str, Any]:
        """Recall the active memories closest to `query` from every space this connection
        reads, best first, each with its score breakdown (similarity, text match, recency,
        kind weight) saying why it ranked where it did."""
        caller = await self.begin(ctx, reads=True)
        with tool_errors():
            body = RecallBody.model_validate(
                {"query": query, "top_k": top_k, "kinds": kinds, "min_similarity": min_similarity}
            )
            results = await ops.recall(self.store, caller.scope, body, self.standing)
        return {"data": [r.as_dict() for r in results]}

    async def remember(
        self,
        ctx: Context,
        content: Annotated[str, Field(description="One self-contained sentence to remember.")],
        kind: Annotated[
            KindName,
            Field(
                description="fact, preference, constraint (a rule to follow), error (a "
                "mistake to avoid), goal or note."
            ),
        ] = "fact",
        subject: Annotated[
            str | None, Field(description="Who or what it is about, e.g. 'user'.")
        ] = None,
        attribute: Annotated[
            str | None,
            Field(
                description="Which property of the subject, e.g. 'city': a new value "
                "for the same subject and attribute supersedes the old one."
            ),
        ] = None,
        value: Annotated[str | None, Field(description="The value, e.g. 'Lisbon'.")] = None,
        confidence: Annotated[float, Field(description="0 to 1.")] = 0.9,
        expires_at: Annotated[
            float | None, Field(description="Unix time after which it no longer holds.")
        ] = None,
    ) -> dict[str, Any]:
        """Remember something in this connection's write space. It is reconciled like a fact
        learned from a chat: the same text reinforces the existing memory, a new value for
        the same subject and attribute supersedes the old one. Answers what was done."""
        caller = await self.begin(ctx, writes=True)
        with tool_errors():
            body = RememberBody.model_validate(
                {
                    "content": content,
                    "kind": kind,
                    "subject": subject,
                    "attribute": attribute,
                    "value": value,
                    "confidence": confidence,
                    "expires_at": expires_at,
                }
            )
            # the agent acts for the key's holder, as in a chat
            fact = ops.fact_from(body, stated_by="user")
            return await ops.remember(
                self.store, self.reconciler, caller.scope, fact, _provenance(caller)
            )

    async def correct(
        self,
        ctx: Context,
        memory_id: Annotated[str, Field(description="The id of the memory that is wrong.")],
        content: Annotated[str, Field(description="The corrected sentence.")],
        kind: Annotated[
            KindName | None, Field(description="A new kind (default: the old one's).")
        ] = None,
        value: Annotated[
            str | None, Field(description="The corrected value, if the memory has a slot.")
        ] = None,
    ) -> dict[str, Any]:
        """Correct a memory of this connection's write space: a new version replaces it (it
        keeps its subject and attribute) and the old one becomes `superseded`, so it is
        never recalled again but stays in the history. Answers both."""
        caller = await self.begin(ctx, writes=True)
        with tool_errors():
            old = await ops.require_memory(
                self.store, caller.scope.tenant, memory_id, (caller.scope.write_space,)
            )
            body = RememberBody.model_validate(
                {"content": content, "kind": kind or old.kind, "value": value}
            )
            new = NewMemory(
                content=body.content,
                kind=body.kind,
                subject=old.subject,
                attribute=old.attribute,
                value=body.value,
                confidence=body.confidence,
                source="user",
                provenance=_provenance(caller),
            )
            superseded, replacement = await self.store.supersede(
                caller.scope.tenant,
                old.id,
                new,
                f"corrected through MCP ({_by(caller)})",
                actor="mcp",
            )
        return {"memory": replacement.as_dict(), "superseded": superseded.as_dict()}

    async def forget(
        self,
        ctx: Context,
        memory_id: Annotated[
            str | None, Field(description="Forget this memory (or give `query`).")
        ] = None,
        query: Annotated[
            str | None,
            Field(description="Forget the memories close to this in meaning (or give an id)."),
        ] = None,
        dry_run: Annotated[
            bool, Field(description="Only say what would be forgotten (the default).")
        ] = True,
        top_k: Annotated[int, Field(description="With `query`: at most this many.")] = 10,
        min_similarity: Annotated[
            float, Field(description="With `query`: only memories at least this close.")
        ] = 0.5,
    ) -> dict[str, Any]:
        """Forget a memory (by id) or the memories matching a query, in the spaces this
        connection reads: content, vector and text are erased, with every earlier version
        it superseded; only a tombstone and the history remain. With dry_run=true (the
        default) nothing changes and the answer lists what would be forgotten."""
        caller = await self.begin(ctx, reads=dry_run, writes=not dry_run)
        if (memory_id is None) == (query is None):
            raise ToolError("give exactly one of memory_id or query")
        scope = caller.scope
        reason = f"forgotten through MCP ({_by(caller)})"
        with tool_errors():
            if query is not None:
                body = ForgetBody.model_validate(
                    {
                        "query": query,
                        "dry_run": dry_run,
                        "top_k": top_k,
                        "min_similarity": min_similarity,
                    }
                )
                return await ops.forget_matching(self.store, scope, body, reason, "mcp")
            assert memory_id is not None
            memory = await ops.require_memory(
                self.store, scope.tenant, memory_id, scope.read_spaces
            )
            if not dry_run:
                memory = await self.store.forget(scope.tenant, memory.id, reason, actor="mcp")
        entry = {"id": memory.id, "content": memory.content, "space": memory.space}
        return {"dry_run": dry_run, "would_forget" if dry_run else "forgotten": [entry]}

    async def list_memories(
        self,
        ctx: Context,
        status: Annotated[
            list[str] | None,
            Field(description=f"Statuses to list: {', '.join(STATUSES)} (default: active)."),
        ] = None,
        kind: Annotated[list[KindName] | None, Field(description="Only these kinds.")] = None,
        space: Annotated[
            list[str] | None,
            Field(description="Only these of the connection's read spaces (default: all)."),
        ] = None,
        limit: Annotated[int, Field(description=f"Page size, 1-{MAX_LIST}.")] = 50,
        cursor: Annotated[
            str | None, Field(description="next_cursor from the previous page.")
        ] = None,
    ) -> dict[str, Any]:
        """List the memories of the spaces this connection reads, newest first, a page at a
        time (active ones unless `status` says otherwise)."""
        caller = await self.begin(ctx, reads=True)
        scope = caller.scope
        spaces = list(dict.fromkeys(space or scope.read_spaces))
        outside = [s for s in spaces if s not in scope.read_spaces]
        if outside:
            raise ToolError(
                f"space(s) {', '.join(map(repr, outside))} are not among this connection's "
                f"read spaces ({', '.join(scope.read_spaces)})"
            )
        wrong = [s for s in status or [] if s not in STATUSES]
        if wrong:
            raise ToolError(f"status must be among {', '.join(STATUSES)} (got {wrong[0]!r})")
        if not 1 <= limit <= MAX_LIST:
            raise ToolError(f"limit must be between 1 and {MAX_LIST}")
        if cursor and not (cursor.isascii() and cursor.isdigit() and int(cursor) < 2**63):
            raise ToolError("cursor must be a next_cursor from this tool")
        with tool_errors():
            page = await self.store.list(
                ListQuery(
                    tenant=scope.tenant,
                    spaces=spaces,
                    statuses=status or ["active"],
                    kinds=list(kind) if kind else None,
                    limit=limit,
                    cursor=cursor or None,
                )
            )
        return {"data": [m.as_dict() for m in page.items], "next_cursor": page.next_cursor}

    async def history(
        self,
        ctx: Context,
        memory_id: Annotated[str, Field(description="The memory whose history to show.")],
    ) -> dict[str, Any]:
        """How one memory of the spaces this connection reads came to be what it is: every
        event (added, reinforced, superseded, forgotten...) with who did it and why."""
        caller = await self.begin(ctx, reads=True)
        scope = caller.scope
        with tool_errors():
            memory = await ops.require_memory(
                self.store, scope.tenant, memory_id, scope.read_spaces
            )
            events = await self.store.history(scope.tenant, memory.id)
        return {"memory": memory.as_dict(), "data": [e.as_dict() for e in events]}


def build_server(
    store: MemoryStore,
    reconciler: Reconciler,
    caller_of: CallerOf,
    ready: Ready | None = None,
    standing: StandingPolicy | None = None,
    **options: Any,
) -> MCPServer:
    """An MCP server whose tools act on `store` for whoever `caller_of` says a call is
    (`ready`, if given, is awaited first: stdio opens the store while the client connects;
    `standing`: standing rules join recalls as in the proxy)."""
    with _logging_left_alone():
        server: MCPServer = MCPServer(
            NAME,
            instructions=INSTRUCTIONS,
            version=_version(),
            subscriptions=False,  # nothing to subscribe to: memories are read via the tools
            **options,
        )
    MemoryTools(store, reconciler, caller_of, ready, standing).register(server)
    return server


def _version() -> str:
    try:
        return metadata.version("memrelay")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0"


@contextlib.contextmanager
def _logging_left_alone() -> Iterator[None]:
    """MCPServer() calls logging.basicConfig: with no root handler yet, it would put a
    rich handler at INFO on the root logger of whatever process builds the app. memrelay
    configures logging itself (proxy/logs.py); a handler held on the root logger for the
    duration makes that call do nothing."""
    root = logging.getLogger()
    hold = logging.NullHandler()
    root.addHandler(hold)
    try:
        yield
    finally:
        root.removeHandler(hold)
