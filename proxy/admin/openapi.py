"""The admin API's OpenAPI document, built from the same pydantic models that validate.

Kept to what the server does: the fuzz test runs every schemathesis check against it."""

from __future__ import annotations

from typing import Any

from proxy.admin.models import ForgetBody, RecallBody, RememberBody

ID = "[A-Za-z0-9._:-]{1,128}"
SCOPE_HEADERS = [
    {
        "name": "X-Memrelay-Tenant",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "pattern": f"^{ID}$"},
    },
    {
        "name": "X-Memrelay-Write-Space",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "pattern": f"^{ID}$"},
    },
    {
        "name": "X-Memrelay-Read-Spaces",
        "in": "header",
        "required": False,
        "description": "Comma-separated spaces (at most 16 by default).",
        "schema": {"type": "string", "pattern": f"^ *{ID}( *, *{ID}){{0,15}} *$"},
    },
]
KINDS = ["fact", "preference", "constraint", "error", "goal", "note"]
STATUSES = ["active", "superseded", "forgotten", "expired"]
JOB_STATUSES = ["pending", "leased", "done", "dead"]
OBJECT = {"type": "object"}


def _list_of(values: list[str]) -> dict[str, Any]:
    """A comma-separated list of `values`, as the server accepts them in one parameter."""
    one = "(" + "|".join(values) + ")"
    return {"type": "string", "pattern": f"^{one}(,{one})*$"}


ERRORS = {
    status: {
        "description": text,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    for status, text in (
        ("400", "bad input"),
        ("401", "missing or wrong key"),
        ("403", "tenant not allowed for this key"),
        ("404", "not found"),
        ("409", "not allowed in this state"),
        ("413", "request body too large"),
        ("422", "invalid fields"),
        ("431", "request headers too large"),
        ("507", "the database's disk is full; nothing was written"),
    )
}


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _op(
    summary: str,
    params: list[dict[str, Any]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    ok: tuple[str, ...] = ("200",),
    ok_type: str = "application/json",
) -> dict[str, Any]:
    success = {"description": "success", "content": {ok_type: {"schema": OBJECT}}}
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": [*SCOPE_HEADERS, *(params or [])],
        "responses": {**dict.fromkeys(ok, success), **ERRORS},
    }
    if body is not None:
        schema = (
            {"$ref": f"#/components/schemas/{body.__name__}"} if isinstance(body, type) else body
        )
        op["requestBody"] = {"required": True, "content": {content_type: {"schema": schema}}}
    return op


def openapi_document() -> dict[str, Any]:
    components = {m.__name__: m.model_json_schema() for m in (RememberBody, RecallBody, ForgetBody)}
    components["Error"] = {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {"message": {"type": "string"}, "type": {"type": "string"}},
            }
        },
    }
    listing = [
        _query("space", {"type": "string", "pattern": f"^{ID}(,{ID})*$"}, "comma-separated"),
        _query("status", _list_of(STATUSES), "comma-separated (default active)"),
        _query("kind", _list_of(KINDS), "comma-separated"),
        _query("subject", {"type": "string"}),
        _query("attribute", {"type": "string"}),
        _query("created_after", {"type": "number"}),
        _query("created_before", {"type": "number"}),
        _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
        _query("cursor", {"type": "string", "pattern": "^[0-9]{1,18}$"}, "a next_cursor"),
    ]
    paths = {
        "/memrelay/v1/memories": {
            "post": _op(
                "Remember a memory (reconciled like extracted facts): 201 when added or "
                "superseding, 200 when it reinforced or changed nothing",
                body=RememberBody,
                ok=("200", "201"),
            ),
            "get": _op("List memories", listing),
        },
        "/memrelay/v1/memories/{memory_id}": {
            "get": _op("Get one memory", [_path("memory_id")]),
            "delete": _op(
                "Forget one memory (the reason recorded is fixed words and ids)",
                [_path("memory_id")],
            ),
        },
        "/memrelay/v1/memories/{memory_id}/history": {
            "get": _op("Events of one memory", [_path("memory_id")]),
        },
        "/memrelay/v1/recall": {"post": _op("Recall with score breakdown", body=RecallBody)},
        "/memrelay/v1/forget": {
            "post": _op("Forget by query (dry run by default)", body=ForgetBody)
        },
        "/memrelay/v1/events": {
            "get": _op(
                "Change feed",
                [
                    _query("since", {"type": "integer", "minimum": 0, "maximum": 2**62}),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                ],
            )
        },
        "/memrelay/v1/stats": {"get": _op("Counts by status, kind and space")},
        "/memrelay/v1/export": {"get": _op("Export as JSONL", ok_type="application/x-ndjson")},
        "/memrelay/v1/import": {
            "post": _op(
                "Import JSONL", body={"type": "string"}, content_type="application/x-ndjson"
            )
        },
        "/memrelay/v1/jobs": {
            "get": _op(
                "Extraction jobs",
                [
                    _query("status", _list_of(JOB_STATUSES), "comma-separated"),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                ],
            )
        },
        "/memrelay/v1/jobs/{job_id}/retry": {
            "post": _op("Retry a dead-lettered job", [_path("job_id")])
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "memrelay admin API", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "memrelayKey": {"type": "apiKey", "in": "header", "name": "X-Memrelay-Key"}
            },
        },
        "security": [{"memrelayKey": []}],
    }
