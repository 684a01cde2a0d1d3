"""The admin API's OpenAPI document, built from the same pydantic models that validate."""

from __future__ import annotations

from typing import Any

from proxy.admin_models import ForgetBody, RecallBody, RememberBody

SCOPE_HEADERS = [
    {
        "name": "X-Memrelay-Tenant",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
    },
    {
        "name": "X-Memrelay-Write-Space",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
    },
    {
        "name": "X-Memrelay-Read-Spaces",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
    },
]
KINDS = ["fact", "preference", "constraint", "error", "goal", "note"]
STATUSES = ["active", "superseded", "forgotten", "expired"]
JOB_STATUSES = ["pending", "leased", "done", "dead"]
OBJECT = {"type": "object"}
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
        ("422", "invalid fields"),
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
    ok: str = "200",
    ok_type: str = "application/json",
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": [*SCOPE_HEADERS, *(params or [])],
        "responses": {
            ok: {"description": "success", "content": {ok_type: {"schema": OBJECT}}},
            **ERRORS,
        },
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
        _query("space", {"type": "string"}),
        _query("status", {"type": "string", "enum": STATUSES}),
        _query("kind", {"type": "string", "enum": KINDS}),
        _query("subject", {"type": "string"}),
        _query("attribute", {"type": "string"}),
        _query("created_after", {"type": "number"}),
        _query("created_before", {"type": "number"}),
        _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
        _query("cursor", {"type": "string"}),
    ]
    paths = {
        "/memrelay/v1/memories": {
            "post": _op("Remember a memory (reconciled like extracted facts)", body=RememberBody),
            "get": _op("List memories", listing),
        },
        "/memrelay/v1/memories/{memory_id}": {
            "get": _op("Get one memory", [_path("memory_id")]),
            "delete": _op(
                "Forget one memory", [_path("memory_id"), _query("reason", {"type": "string"})]
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
                    _query("since", {"type": "integer", "minimum": 0}),
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
                    _query("status", {"type": "string", "enum": JOB_STATUSES}),
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
