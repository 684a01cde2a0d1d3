"""Property-based fuzz of the admin API against its own OpenAPI document, with every
schemathesis check (not only "no 5xx"): status codes, content types, headers and bodies
conform to the document, valid data is accepted, invalid data rejected, unsupported
methods refused with Allow, and the key is never ignored.

Schemathesis generates the cases from /memrelay/openapi.json; hypothesis drives them
(its pytest plugin does not load under this pytest, so the loop is explicit).
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup

from proxy.edge.keys import KeyStore


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx: object, value: object) -> bytes:
    """Import bodies are JSON lines; arbitrary generated values are sent as their text."""
    return value.encode() if isinstance(value, str) else str(value).encode()


# An import body is JSON lines: the document can only say "a string", so whether each
# line is a valid memory record is not expressible in OpenAPI. A 422 naming the lines
# that were refused is the documented answer to such schema-valid bodies; every other
# operation keeps schemathesis's default expectation for valid data.
IMPORT_ACCEPTS = {
    "operations": [
        {
            "include-path": "/memrelay/v1/import",
            "checks": {
                "positive_data_acceptance": {
                    "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
                }
            },
        }
    ]
}


def all_checks() -> list:
    load_all_checks()
    return list(CHECKS.get_all())


def test_admin_api_conforms_to_its_document_under_every_check(memory_proxy, tmp_path):
    keys = KeyStore(tmp_path / "keys.json")
    admin, _ = keys.create([], admin=True)
    server, seed = memory_proxy(keys_file=tmp_path / "keys.json")
    seed.add("default", "default", "The user likes fuzzing")
    seed.add("default", "default", "Never run fuzzers against production", kind="constraint")
    schema = schemathesis.openapi.from_url(
        server.url + "/memrelay/openapi.json",
        headers={"X-Memrelay-Key": admin},
        config=SchemathesisConfig.from_dict(IMPORT_ACCEPTS),
    )
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 13
    checks = all_checks()
    assert len(checks) >= 14
    failures: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def check(case: schemathesis.Case) -> None:
            try:
                case.call_and_validate(
                    base_url=server.url,
                    headers={"X-Memrelay-Key": admin},
                    checks=checks,
                    timeout=30,
                )
            except (AssertionError, FailureGroup) as exc:  # how schemathesis reports a failed check
                failures.append(f"{case.method} {case.formatted_path}: {str(exc)[:600]}")

        check()
    assert failures == [], "\n\n".join(failures[:8])
