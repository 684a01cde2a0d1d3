"""Log records as JSON lines: what the server and its search process both write."""

from __future__ import annotations

import json
import logging
import time
from typing import Any


class JSONLines(logging.Formatter):
    """One JSON object a line: time, level, logger, `fields()`, message, error."""

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """What a subclass adds (the server: the request's id, key and tenant)."""
        return {}

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            **self.fields(record),
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)
