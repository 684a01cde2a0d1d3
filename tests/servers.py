"""Serve an ASGI app for real with uvicorn on a free loopback port, in a thread.

uvicorn binds the port itself: handing it a pre-bound socket leaves accepted
connections without TCP_NODELAY here, which adds a delayed-ACK stall (about 40 ms) to
every exchange and would distort latency figures.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServedApp:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = 0
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServedApp:
        for _attempt in range(5):  # another process may take the port between probe and bind
            self.port = free_port()
            config = uvicorn.Config(
                self.app,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                lifespan="on",
                server_header=False,
                date_header=False,
                timeout_graceful_shutdown=3,
            )
            self.server = uvicorn.Server(config)
            self.thread = threading.Thread(target=self.server.run, daemon=True)
            self.thread.start()
            deadline = time.monotonic() + 30
            while not self.server.started and self.thread.is_alive():
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not start")
                time.sleep(0.005)
            if self.server.started:
                return self
        raise RuntimeError("could not bind a free port")

    def __exit__(self, *exc: object) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(10)
