"""The SQL of a filtered, paged memory listing, for either backend's placeholder style."""

from __future__ import annotations

from typing import Any

from memory_core.errors import InvalidInput
from memory_core.model import KINDS, STATUSES, normalise_slot, validate_id
from memory_core.rows import MEMORY_COLUMNS, memory_from_row
from memory_core.store import ListQuery

MAX_LIMIT = 1000


def list_sql(query: ListQuery, mark: str, key: str) -> tuple[str, list[Any], int]:
    """SELECT key, columns ... newest first; `mark` is `?` or `%s`, `key` the row order.

    Fetches one row past the limit so the caller knows whether a next page exists.
    """
    validate_id(query.tenant, "tenant")
    sql = f"SELECT {key}, {MEMORY_COLUMNS} FROM memories WHERE tenant = {mark}"
    params: list[Any] = [query.tenant]
    for column, values, allowed in (
        ("space", query.spaces, None),
        ("status", query.statuses, STATUSES),
        ("kind", query.kinds, KINDS),
    ):
        if values:
            for value in values:
                if allowed is not None and value not in allowed:
                    raise InvalidInput(f"{column} must be one of {', '.join(allowed)}")
                if column == "space":
                    validate_id(value, "space")
            sql += f" AND {column} IN ({','.join([mark] * len(values))})"
            params += values
    for column, value in (("subject", query.subject), ("attribute", query.attribute)):
        if value:
            sql += f" AND {column} = {mark}"
            params.append(normalise_slot(value))
    if query.created_after is not None:
        sql += f" AND created_at >= {mark}"
        params.append(query.created_after)
    if query.created_before is not None:
        sql += f" AND created_at < {mark}"
        params.append(query.created_before)
    if query.cursor:
        try:
            position = int(query.cursor)
        except ValueError as exc:
            raise InvalidInput(f"bad cursor {query.cursor!r}") from exc
        if not 0 <= position < 2**63:  # a database integer; past it SQLite overflows
            raise InvalidInput(f"bad cursor {query.cursor[:32]!r}")
        params.append(position)
        sql += f" AND {key} < {mark}"
    limit = max(1, min(query.limit, MAX_LIMIT))
    sql += f" ORDER BY {key} DESC LIMIT {mark}"
    params.append(limit + 1)
    return sql, params, limit


def page_of(rows: list[Any], limit: int) -> tuple[list[Any], str | None]:
    """The rows of this page (key dropped) and the cursor of the next one."""
    items = [memory_from_row(row[1:]) for row in rows[:limit]]
    return items, (str(rows[limit - 1][0]) if len(rows) > limit else None)
