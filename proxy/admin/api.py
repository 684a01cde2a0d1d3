"""The admin REST API under /memrelay/v1: see, correct and control what is remembered.

Scoped by the identity the edge decided (proxy/edge/identity.py): the same X-Memrelay-*
headers as the proxy, parsed once and bound to keys there; nothing here reads a header.
Every operation is the library's: `memory_core` for memories and events,
`extraction.Reconciler` for remember, the job queue for jobs. Every error is the OpenAI
shape with a string `code`; bodies are bounded (import is spooled to a capped file first,
so a refused import writes nothing); a full disk is a 507 naming it.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from extraction.reconcile import Reconciler
from memory_core.errors import InvalidInput, InvalidTransition, NotFound
from memory_core.jobs import JobQueue
from memory_core.model import KINDS, STATUSES
from memory_core.store import ListQuery, MemoryStore
from proxy.admin import memory_ops as ops
from proxy.admin.models import ForgetBody, RecallBody, RememberBody
from proxy.edge.identity import identity_of
from proxy.memory.scoping import MemoryScope
from proxy.relay.hooks import RequestRejected
from proxy.relay.json_input import BadJSON, loads
from proxy.settings import Settings
from proxy.storage import storage_full

Handler = Callable[[Request], Awaitable[Response]]


def error(
    status: int, message: str, type_: str, code: str, details: Any = None, param: Any = None
) -> JSONResponse:
    """The OpenAI error shape, as the proxy sends it (string `code`)."""
    body: dict[str, Any] = {
        "error": {"message": message, "type": type_, "param": param, "code": code}
    }
    if details is not None:
        body["error"]["details"] = details
    return JSONResponse(body, status_code=status)


class Unprocessable(Exception):
    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.details = details


class TooLarge(Exception):
    """The request body passed its limit while being read."""


def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise Unprocessable(f"query parameter {name!r} must be an integer") from exc
    if not low <= value <= high:
        raise Unprocessable(f"query parameter {name!r} must be between {low} and {high}")
    return value


def _float(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise Unprocessable(f"query parameter {name!r} must be a number") from exc
    if not math.isfinite(value):
        raise Unprocessable(f"query parameter {name!r} must be a finite number")
    return value


def _cursor(request: Request) -> str | None:
    raw = request.query_params.get("cursor")
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or int(raw) >= 2**63:
        raise RequestRejected(400, "query parameter 'cursor' must be a next_cursor from this API")
    return raw


def _choices(request: Request, name: str, allowed: tuple[str, ...]) -> list[str] | None:
    values = [v for raw in request.query_params.getlist(name) for v in raw.split(",") if v]
    for value in values:
        if value not in allowed:
            raise Unprocessable(f"{name} must be one of {', '.join(allowed)} (got {value!r})")
    return values or None


class AdminAPI:
    def __init__(
        self, store: MemoryStore, jobs: JobQueue, reconciler: Reconciler, settings: Settings
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.reconciler = reconciler
        self.settings = settings

    def routes(self) -> list[Route]:
        p = "/memrelay/v1"
        table: list[tuple[str, str, Handler]] = [
            ("POST", "/memories", self.remember),
            ("GET", "/memories", self.list),
            ("GET", "/memories/{memory_id}", self.get),
            ("DELETE", "/memories/{memory_id}", self.forget),
            ("GET", "/memories/{memory_id}/history", self.history),
            ("POST", "/recall", self.recall),
            ("POST", "/forget", self.forget_by_query),
            ("GET", "/events", self.events),
            ("GET", "/stats", self.stats),
            ("GET", "/export", self.export),
            ("POST", "/import", self.import_),
            ("GET", "/jobs", self.list_jobs),
            ("POST", "/jobs/{job_id}/retry", self.retry_job),
        ]
        return [Route(p + path, self._guard(fn), methods=[method]) for method, path, fn in table]

    def _guard(self, fn: Handler) -> Handler:
        async def handler(request: Request) -> Response:
            try:
                return await fn(request)
            except RequestRejected as exc:
                return error(exc.status, exc.message, "invalid_request_error", "invalid_request")
            except BadJSON as exc:
                return error(400, str(exc), "invalid_request_error", "invalid_json")
            except TooLarge as exc:
                return error(413, str(exc), "invalid_request_error", "body_too_large")
            except Unprocessable as exc:
                return error(
                    422, str(exc), "invalid_request_error", "validation_error", exc.details
                )
            except ValidationError as exc:
                details = [
                    {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
                    for e in exc.errors()
                ]
                return error(
                    422,
                    "request body is invalid",
                    "invalid_request_error",
                    "validation_error",
                    details,
                )
            except NotFound as exc:
                return error(404, str(exc), "invalid_request_error", "not_found")
            except InvalidTransition as exc:
                return error(409, str(exc), "invalid_request_error", "conflict")
            except InvalidInput as exc:
                return error(400, str(exc), "invalid_request_error", "invalid_input")
            except Exception as exc:
                if storage_full(exc):
                    return error(
                        507,
                        "the memory database's disk is full; nothing was written",
                        "server_error",
                        "storage_full",
                    )
                raise

        handler.__name__ = fn.__name__
        return handler

    def _scope(self, request: Request) -> MemoryScope:
        return identity_of(request.scope).memory

    async def _read(self, request: Request, limit: int) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"request body exceeds {limit} bytes")
            yield chunk

    async def _body(self, request: Request, model: type[BaseModel]) -> Any:
        limit = self.settings.admin_max_body_bytes
        raw = b"".join([chunk async for chunk in self._read(request, limit)])
        data = loads(raw or b"{}")
        if not isinstance(data, dict):
            raise Unprocessable("request body must be a JSON object")
        return model.model_validate(data)

    # -- memories --------------------------------------------------------------------

    async def remember(self, request: Request) -> Response:
        scope = self._scope(request)
        body: RememberBody = await self._body(request, RememberBody)
        fact = ops.fact_from(body, stated_by="admin")
        provenance = {
            "request_id": request.state.memrelay_request_id,
            "time": time.time(),
            "via": "admin",
        }
        result = await ops.remember(self.store, self.reconciler, scope, fact, provenance)
        actions = {result["action"], *(part["action"] for part in result.get("parts", []))}
        status = 201 if actions & {"added", "superseded"} else 200
        return JSONResponse(result, status_code=status)

    async def list(self, request: Request) -> Response:
        scope = self._scope(request)
        spaces = [s for raw in request.query_params.getlist("space") for s in raw.split(",") if s]
        statuses = _choices(request, "status", STATUSES) or ["active"]
        query = ListQuery(
            tenant=scope.tenant,
            spaces=spaces or None,
            statuses=statuses,
            kinds=_choices(request, "kind", KINDS),
            subject=request.query_params.get("subject"),
            attribute=request.query_params.get("attribute"),
            created_after=_float(request, "created_after"),
            created_before=_float(request, "created_before"),
            limit=_int(request, "limit", 50, 1, 1000),
            cursor=_cursor(request),
        )
        page = await self.store.list(query)
        return JSONResponse(
            {"data": [m.as_dict() for m in page.items], "next_cursor": page.next_cursor}
        )

    async def get(self, request: Request) -> Response:
        scope = self._scope(request)
        memory = await ops.require_memory(
            self.store, scope.tenant, request.path_params["memory_id"]
        )
        return JSONResponse(memory.as_dict())

    async def forget(self, request: Request) -> Response:
        scope = self._scope(request)
        reason = ops.forget_reason("admin API", _request_id(request))
        memory = await self.store.forget(
            scope.tenant, request.path_params["memory_id"], reason, actor="admin"
        )
        return JSONResponse(memory.as_dict())

    async def history(self, request: Request) -> Response:
        scope = self._scope(request)
        events = await ops.history(self.store, scope.tenant, request.path_params["memory_id"])
        return JSONResponse({"data": [e.as_dict() for e in events]})

    async def recall(self, request: Request) -> Response:
        scope = self._scope(request)
        body: RecallBody = await self._body(request, RecallBody)
        results = await ops.recall(self.store, scope, body, self.settings.standing_policy())
        return JSONResponse({"data": [r.as_dict() for r in results]})

    async def forget_by_query(self, request: Request) -> Response:
        scope = self._scope(request)
        body: ForgetBody = await self._body(request, ForgetBody)
        # Fixed words and ids only: the query says what was secret, so it is not kept.
        reason = f"forgotten by query through the admin API (request {_request_id(request)})"
        return JSONResponse(await ops.forget_matching(self.store, scope, body, reason, "admin"))

    async def events(self, request: Request) -> Response:
        scope = self._scope(request)
        since = _int(request, "since", 0, 0, 2**62)
        events = await self.store.events(scope.tenant, since, _int(request, "limit", 100, 1, 1000))
        cursor = events[-1].seq if events else since
        return JSONResponse({"data": [e.as_dict() for e in events], "next_cursor": cursor})

    async def stats(self, request: Request) -> Response:
        scope = self._scope(request)
        return JSONResponse(await ops.tenant_stats(self.store, self.jobs, scope.tenant))

    # -- transfer --------------------------------------------------------------------

    async def export(self, request: Request) -> Response:
        scope = self._scope(request)

        async def lines() -> AsyncIterator[bytes]:
            async for line in self.store.export(scope.tenant):
                yield line.encode() + b"\n"

        return StreamingResponse(
            lines(),
            media_type="application/x-ndjson",
            headers={"content-disposition": f'attachment; filename="{scope.tenant}.jsonl"'},
        )

    async def import_(self, request: Request) -> Response:
        """The body is spooled (memory, then a temporary file) up to the import cap before
        any line is imported, so an import refused for its size writes nothing."""
        scope = self._scope(request)
        totals: dict[str, Any] = {"imported": 0, "skipped": 0, "errors": []}
        batch: list[str] = []

        async def flush() -> None:
            result = await self.store.import_lines(scope.tenant, batch)
            totals["imported"] += result.imported
            totals["skipped"] += result.skipped
            totals["errors"].extend(result.errors[: 100 - len(totals["errors"])])
            batch.clear()

        with tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024) as spool:
            async for chunk in self._read(request, self.settings.import_max_bytes):
                spool.write(chunk)
            spool.seek(0)
            for line in spool:
                batch.append(line.decode("utf-8", "replace").rstrip("\n"))
                if len(batch) >= 500:
                    await flush()
        await flush()
        if totals["errors"]:  # never a quiet 200: say which lines were not imported
            first = totals["errors"][0]
            error = {"message": first, "type": "invalid_request_error", "code": "import_errors"}
            return JSONResponse({"error": error, **totals}, status_code=422)
        return JSONResponse(totals)

    # -- jobs ------------------------------------------------------------------------

    async def list_jobs(self, request: Request) -> Response:
        scope = self._scope(request)
        statuses = _choices(request, "status", ("pending", "leased", "done", "dead"))
        jobs = await self.jobs.list_jobs(
            scope.tenant, statuses, _int(request, "limit", 100, 1, 1000)
        )
        return JSONResponse(
            {
                "data": [j.as_dict() for j in jobs],
                "counts": await self.jobs.job_counts(scope.tenant),
            }
        )

    async def retry_job(self, request: Request) -> Response:
        scope = self._scope(request)
        job = await self.jobs.retry(scope.tenant, request.path_params["job_id"])
        return JSONResponse(job.as_dict())


def _request_id(request: Request) -> str:
    return str(getattr(request.state, "memrelay_request_id", "") or "-")
