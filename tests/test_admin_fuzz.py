"""Property-based fuzz of the admin API against its own OpenAPI document: no 5xx, ever.

Schemathesis generates the cases from /memrelay/openapi.json; hypothesis drives them
(its pytest plugin does not load under this pytest, so the loop is explicit).
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx: object, value: object) -> bytes:
    """Import bodies are JSON lines; arbitrary generated values are sent as their text."""
    return value.encode() if isinstance(value, str) else str(value).encode()


def test_admin_api_never_fails_with_5xx(memory_proxy):
    server, seed = memory_proxy()
    seed.add("default", "default", "The user likes fuzzing")
    seed.add("default", "default", "Never run fuzzers against production", kind="constraint")
    schema = schemathesis.openapi.from_url(server.url + "/memrelay/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 13
    failures: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def check(case: schemathesis.Case) -> None:
            response = case.call(base_url=server.url, timeout=30)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path}: {response.status_code} "
                    f"{response.text[:300]}"
                )

        check()
    assert failures == []
