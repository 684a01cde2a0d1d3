"""Dead-lettered jobs that a forget erases.

A dead job keeps its payload for a retry. When the user later asks to forget something
in words, the forget erases the payload of every dead job of the tenant, in the spaces
it reaches, whose text holds all the request's words (`erase_dead`; the caller decides
the match): the row stays, with a fixed last_error, and a NULL payload on a dead job is
the mark that refuses a retry (nothing else leaves a dead job without a payload), since
retrying it would learn the forgotten fact again. Shared by both backends' queues
(memory_core/sqlite/jobs.py runs `erase_dead`; Postgres uses the SQL and marks).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from memory_core.sqlite.db import Connection

# Fixed words plus the forget's job id, never the user's (as for memories' reasons).
ERASED_BY_FORGET = "payload erased by a forget request"
ERASE_PAGE = 200  # dead jobs read per page while a forget looks for its words in them
DEAD_WITH_PAYLOAD_SQL = (
    "SELECT seq, id, payload FROM jobs WHERE tenant = {m} AND status = 'dead'"
    " AND payload IS NOT NULL AND seq > {m} AND space IN ({spaces}) ORDER BY seq LIMIT {m}"
)
ERASE_SQL = (
    "UPDATE jobs SET payload = NULL, content_hash = NULL, last_error = {m}, result = {m},"
    " updated_at = {m} WHERE id = {m} AND status = 'dead'"
)


def erased_message(job_id: str) -> str:
    return (
        f"job {job_id!r} cannot be retried: its conversation text was erased by a forget"
        " request (purge it)"
    )


def erased_marks(by_job: str | None) -> tuple[str, dict[str, Any]]:
    """The last_error and result an erased dead job keeps (fixed words and a job id)."""
    reason = ERASED_BY_FORGET + (f" (job {by_job})" if by_job else "")
    return reason, {"erased": "forget", "by_job": by_job}


def erase_dead(
    conn: Connection,
    tenant: str,
    spaces: list[str],
    holds: Callable[[dict[str, Any]], bool],
    by_job: str | None,
) -> list[str]:
    """Erase the payload of every dead job of `tenant` in `spaces` that `holds` matches,
    a page at a time (one write transaction: a retry cannot slip in between)."""
    if not spaces:
        return []
    sql = DEAD_WITH_PAYLOAD_SQL.format(m="?", spaces=",".join("?" * len(spaces)))
    reason, result = erased_marks(by_job)
    erased: list[str] = []
    after = 0
    while True:
        rows = conn.execute(sql, (tenant, after, *spaces, ERASE_PAGE)).fetchall()
        for seq, job_id, payload in rows:
            after = seq
            if holds(json.loads(payload)):
                conn.execute(
                    ERASE_SQL.format(m="?"), (reason, json.dumps(result), time.time(), job_id)
                )
                erased.append(job_id)
        if len(rows) < ERASE_PAGE:
            return erased
