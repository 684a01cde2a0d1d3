"""The MCP server over streamable HTTP at /memrelay/mcp, behind the same edge as the rest.

The edge (proxy/edge/auth.py) has already checked the key, bound the tenant and parsed
the spaces before a request reaches this route; each tool call reads that decision from
its own HTTP request (proxy/admin/mcp_server.py). The transport is stateless (no MCP
session outlives its request), so every request stands on its own key, and replicas behind
a load balancer need no sticky sessions. Its session manager runs with the app: started in
the lifespan before the first request, stopped after the last (`start` / `close`, like
every other resource).
"""

from __future__ import annotations

import contextlib
import logging

from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route

from extraction.reconcile import Reconciler
from memory_core.store import MemoryStore
from proxy.admin.mcp_server import build_server, http_caller
from proxy.settings import Settings

MCP_PATH = "/memrelay/mcp"
LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


def transport_security(settings: Settings) -> TransportSecuritySettings:
    """Without keys memrelay serves loopback only; then a web page must not reach the
    tools through DNS rebinding, so Host and Origin must be loopback ones. With keys, the
    key decides (and a reverse proxy may send any Host)."""
    if settings.keys_file is not None or settings.insecure:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=LOOPBACK_HOSTS,
        allowed_origins=LOOPBACK_ORIGINS,
    )


class MCPEndpoint:
    """The route and the session manager's lifetime (a Resource of the app)."""

    def __init__(self, store: MemoryStore, reconciler: Reconciler, settings: Settings) -> None:
        self.server: MCPServer = build_server(
            store, reconciler, http_caller, standing=settings.standing_policy()
        )
        self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            json_response=True,
            max_request_body_size=settings.admin_max_body_bytes,
            transport_security=transport_security(settings),
        )
        self.manager = self.server.session_manager
        # The SDK logs every request at INFO; memrelay logs requests itself.
        logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)
        self._running = contextlib.AsyncExitStack()

    def route(self) -> Route:
        return Route(MCP_PATH, StreamableHTTPASGIApp(self.manager))

    async def start(self) -> None:
        await self._running.enter_async_context(self.manager.run())

    async def close(self) -> None:
        await self._running.aclose()
