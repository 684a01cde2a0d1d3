"""Checks `memrelay serve` makes before it starts anything with side effects.

A second server started on a busy port must fail at once: before it starts llama.cpp,
opens the store or touches the job queue (and so before it could disturb the running
server's work).
"""

from __future__ import annotations

import socket


class PortBusy(RuntimeError):
    """The port cannot be bound; the message says which and why."""


def check_port_free(host: str, port: int) -> None:
    """Bind `host:port` the way uvicorn will (SO_REUSEADDR), then let it go.

    Port 0 (any free port) is always fine. A listener on the port makes this fail on
    Linux even with SO_REUSEADDR, which only allows reusing a port in TIME_WAIT.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PortBusy(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
