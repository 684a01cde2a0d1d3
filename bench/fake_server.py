"""The paced fake upstream as a process of its own: `python -m bench.fake_server PORT`.

Every chat completion gets the same streamed answer (bench.common.paced_reply), so the
proxies in front of it are measured, not the model.
"""

from __future__ import annotations

import sys

import uvicorn

from bench.common import paced_reply
from tests.fake_upstream import FakeUpstream


class PacedUpstream(FakeUpstream):
    """Keeps no request log: a long benchmark would otherwise grow it without bound."""

    async def __call__(self, scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        await super().__call__(scope, receive, send)
        if scope["type"] == "http":
            with self.lock:
                self.requests.clear()
                self.sent.clear()


def main() -> None:
    fake = PacedUpstream()
    fake.responder = lambda request: paced_reply()
    uvicorn.run(
        fake,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        log_level="warning",
        access_log=False,
        server_header=False,
        date_header=False,
    )


if __name__ == "__main__":
    main()
