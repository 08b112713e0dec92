"""The HTTP API as a powertools REST resolver: the same app behind API Gateway and `agentq dev`.

Routes validate with pydantic; every error is JSON ``{"error": {"code", "message", "field"?}}``.
The tenant comes from the authorizer context (API Gateway) or is ``local`` on the dev stack.
This issue ships submit, status and health; the API issue fills in the rest.
"""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError

from agentq import control
from agentq.errors import AgentqError, IllegalTransition, TaskNotFound, ValidationError
from agentq.models import Task
from agentq.queue import TaskQueues
from agentq.store import Store
from agentq.submit import submit
from agentq.tools import ToolRegistry

log = logging.getLogger("agentq.api")

MAX_BODY_BYTES = 256 * 1024
_REQUIRED = object()


def _json(status: int, body: Any) -> Response[str]:
    return Response(status_code=status, content_type="application/json", body=json.dumps(body, default=_default))


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(type(value).__name__)


def _error(status: int, code: str, message: str, field: str | None = None) -> Response[str]:
    err: dict[str, Any] = {"code": code, "message": message}
    if field:
        err["field"] = field
    return _json(status, {"error": err})


def task_view(task: Task) -> dict[str, Any]:
    """What a caller sees of a task (the tenant's own view; no lease internals)."""
    return {
        "task_id": task.task_id,
        "status": task.status.value,
        "step": task.step,
        "llm_steps": task.llm_steps,
        "priority": task.submission.priority,
        "tokens": {"input": task.tokens_in, "output": task.tokens_out, "budget": task.submission.constraints.max_tokens},
        "cost_usd": str(task.cost_usd),
        "result": task.result,
        "error": task.error,
        "created_at": task.created_at,
        "started_at": task.started_at,
        "finished_at": task.finished_at,
        "latency": {"pickup_seconds": task.pickup_latency, "resumes": max(0, len(task.claims) - 1)},
        "links": {"self": f"/tasks/{task.task_id}"},
    }


def build_app(store: Store, tools: ToolRegistry, queues: TaskQueues, fanout: Any = None) -> APIGatewayRestResolver:
    app = APIGatewayRestResolver(enable_validation=True)

    def body() -> dict[str, Any]:
        raw = app.current_event.body or ""
        if len(raw.encode()) > MAX_BODY_BYTES:
            raise ValidationError(f"request body over {MAX_BODY_BYTES} bytes", field="body")
        try:
            data = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ValidationError(f"body is not valid JSON: {exc}", field="body") from None
        if not isinstance(data, dict):
            raise ValidationError("body must be a JSON object", field="body")
        return data

    def field(data: dict[str, Any], name: str, kind: type, default: Any = _REQUIRED) -> Any:
        if data.get(name) is None:
            if default is _REQUIRED:
                raise ValidationError(f"{name} is required", field=name)
            return default
        value = data[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValidationError(f"{name} must be {'an integer' if kind is int else 'a string'}", field=name)
        return value

    def tenant() -> str:
        ctx = app.current_event.request_context.authorizer
        value = ctx.get("tenant") if ctx else None
        return str(value or "local")

    @app.get("/health")
    def health() -> Response[str]:
        return _json(200, {"status": "ok"})

    @app.post("/tasks")
    def create_task() -> Response[str]:
        raw = app.current_event.body or ""
        if len(raw.encode()) > MAX_BODY_BYTES:
            return _error(413, "body_too_large", f"request body over {MAX_BODY_BYTES} bytes", "body")
        try:
            body = json.loads(raw) if raw else None
        except ValueError as exc:
            return _error(400, "invalid_json", f"body is not valid JSON: {exc}", "body")
        task = submit(store, tools, body, tenant=tenant(), queues=queues)
        return _json(202, {"task_id": task.task_id, "status": task.status.value, "links": {"self": f"/tasks/{task.task_id}"}})

    @app.get("/tasks/<task_id>")
    def get_task(task_id: str) -> Response[str]:
        task = store.get_task(task_id)
        if task.tenant != tenant():
            raise TaskNotFound(f"no task {task_id!r}", field="task_id")  # 404, not 403: no oracle
        return _json(200, task_view(task))

    @app.post("/tasks/<task_id>/cancel")
    def cancel_task(task_id: str) -> Response[str]:
        cancelled = control.cancel(store, task_id, tenant=tenant(), fanout=fanout)
        return _json(200, {"task_id": task_id, "cancelled": cancelled})

    @app.post("/tasks/<task_id>/approve")
    def approve(task_id: str) -> Response[str]:
        data = body()
        task = control.decide(store, queues, task_id, approved=True, note=field(data, "note", str, ""), by=tenant(), tenant=tenant())
        return _json(200, task_view(task))

    @app.post("/tasks/<task_id>/reject")
    def reject(task_id: str) -> Response[str]:
        data = body()
        task = control.decide(store, queues, task_id, approved=False, note=field(data, "note", str, ""), by=tenant(), tenant=tenant())
        return _json(200, task_view(task))

    @app.post("/tasks/<task_id>/budget")
    def budget(task_id: str) -> Response[str]:
        data = body()
        task = control.raise_budget(
            store, queues, task_id, add_tokens=field(data, "add_tokens", int, 0), add_steps=field(data, "add_steps", int, 0), tenant=tenant()
        )
        return _json(200, task_view(task))

    @app.post("/tasks/<task_id>/fork")
    def fork(task_id: str) -> Response[str]:
        data = body()
        at_step = field(data, "at_step", int)
        overrides = {k: v for k, v in data.items() if k != "at_step"}
        task = control.fork(store, tools, queues, task_id, at_step=at_step, overrides=overrides, tenant=tenant())
        return _json(202, task_view(task))

    @app.exception_handler(IllegalTransition)
    def on_conflict(exc: IllegalTransition) -> Response[str]:
        return _error(409, exc.code, exc.message, exc.field)

    @app.exception_handler(ValidationError)
    def on_validation(exc: ValidationError) -> Response[str]:
        return _error(400, exc.code, exc.message, exc.field)

    @app.exception_handler(TaskNotFound)
    def on_not_found(exc: TaskNotFound) -> Response[str]:
        return _error(404, exc.code, exc.message, exc.field)

    @app.exception_handler(AgentqError)
    def on_agentq(exc: AgentqError) -> Response[str]:
        return _error(409, exc.code, exc.message, exc.field)

    @app.exception_handler(RequestValidationError)
    def on_request_validation(exc: RequestValidationError) -> Response[str]:
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")) or None
        return _error(422, "validation_error", str(first.get("msg", "invalid request")), field)

    @app.not_found
    def on_missing_route(exc: Exception) -> Response[str]:
        return _error(404, "route_not_found", f"no route {app.current_event.http_method} {app.current_event.path}")

    @app.exception_handler(Exception)
    def on_unexpected(exc: Exception) -> Response[str]:
        log.exception("unhandled error")
        return _error(500, "internal_error", "internal error; see the service logs")

    return app
