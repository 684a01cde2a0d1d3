"""Structured logs: one JSON object per line, each carrying the request id."""

from __future__ import annotations

import json
import logging
import time

from proxy.edge.identity import LOG_FIELDS
from proxy.relay.timing import REQUEST_ID_VAR


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": REQUEST_ID_VAR.get(),
            "key_id": LOG_FIELDS.get()[0],  # from the edge's decision, never a raw header
            "tenant": LOG_FIELDS.get()[1],
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # memrelay logs requests itself
