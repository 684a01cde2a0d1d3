"""Structured logs: one JSON object per line, each carrying the request id."""

from __future__ import annotations

import logging
import sys
from typing import Any

from memory_core.json_logs import JSONLines
from proxy.edge.identity import LOG_FIELDS
from proxy.relay.timing import REQUEST_ID_VAR


class JSONFormatter(JSONLines):
    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        return {
            "request_id": REQUEST_ID_VAR.get(),
            "key_id": LOG_FIELDS.get()[0],  # from the edge's decision, never a raw header
            "tenant": LOG_FIELDS.get()[1],
        }


class CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is when a record is written, not when the handler
    was made: a CLI runner (tests, embedding apps) swaps stderr and closes its stand-in,
    and a handler holding the closed one printed "--- Logging error ---" ever after."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_logging(level: str) -> None:
    handler = CurrentStderr()
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # memrelay logs requests itself
