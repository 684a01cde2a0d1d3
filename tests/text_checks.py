"""Looking for a user's words in what memrelay shows, without false alarms from the
identifiers it generates.

Memory and job ids (`mem_…`, `job_…`) and event, request and signature hex are random
hex, and times are decimals (1796143499.9080808): a short code such as "4711" turns up in
one of them by chance (a tenant-isolation page check failed so in CI, on an id of
alice's own memory). The check must still fail when the words themselves are there, so
only generated ids and times are blanked.
"""

from __future__ import annotations

import re

GENERATED_ID = re.compile(r"\b(?:mem|job)_[0-9a-f]+\b|[0-9a-f]{16,}|\d+\.\d+")


def without_generated_ids(text: str) -> str:
    """`text` with every generated id, hex blob and decimal replaced by `<id>`."""
    return GENERATED_ID.sub("<id>", text)
