"""The HTTP API as a powertools REST resolver: the same app behind API Gateway and `agentq dev`.

Routes validate with pydantic (``api_models``) and the OpenAPI document at ``/openapi.json`` is
generated from them. Every error is JSON ``{"error": {"code", "message", "field"?}}``:

- 400 the request cannot be read: ``invalid_json``, ``invalid_cursor``
- 401 ``unauthorized``: no tenant (no valid ``Authorization: Bearer <key>``)
- 404 ``task_not_found`` (another tenant's task too: no oracle), ``route_not_found``;
  405 ``method_not_allowed`` (with ``Allow``)
- 409 ``illegal_transition`` (the task's state forbids it), ``idempotency_conflict``,
  ``task_not_finished``
- 413 ``body_too_large``; 415 ``unsupported_media_type``
- 422 ``validation_error``: a field's value is invalid; ``field`` names it (``constraints.tools[0]``)

The tenant comes from the authorizer context (``requestContext.authorizer.tenant``): API
Gateway's Lambda authorizer puts it there, and the local server does the same in-process.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.api_gateway import Route
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
    ResponseValidationError,
)
from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Path, Query

from agentq import observe
from agentq.api import views as api_views
from agentq.api.models import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_TRACE_PAGE,
    IDEMPOTENCY_KEY_PATTERN,
    MAX_BODY_BYTES,
    MAX_PAGE_SIZE,
    MAX_TRACE_PAGE,
    TASK_ID_PATTERN,
    BudgetRequest,
    CancelResult,
    DecisionRequest,
    ErrorResponse,
    ForkRequest,
    Health,
    TaskAccepted,
    TaskLinks,
    TaskPage,
    TaskResult,
    TaskView,
    TracePage,
)
from agentq.control import operations as control
from agentq.control.defaults import Defaults
from agentq.control.submit import request_hash, submit_once
from agentq.core.errors import AgentqError, IdempotencyConflict, IllegalTransition, TaskNotFound, ValidationError
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.core.providers.scripted import builtin_script_names
from agentq.core.tools import ToolRegistry
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage

log = logging.getLogger("agentq.api")

API_VERSION = "1.0.0"
PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})  # answered without a tenant
JSON = "application/json"

_ERRORS = {
    400: "The request cannot be read (invalid_json, invalid_cursor)",
    401: "No valid API key (unauthorized)",
    404: "No such task for this tenant (task_not_found)",
    405: "Wrong method for this path (method_not_allowed; Allow lists the right ones)",
    409: "The task's state forbids it (illegal_transition, idempotency_conflict, task_not_finished)",
    413: f"Request body over {MAX_BODY_BYTES} bytes (body_too_large)",
    415: "Request body is not JSON (unsupported_media_type)",
    422: "A field is invalid (validation_error); `field` names it",
}
# Type tags pydantic puts in an error location (union members, validators): not field names.
_LOC_NOISE = ("function-", "constrained-", "list[", "dict[", "json-or-python[", "nullable[", "union[", "tagged-union[")
TaskId = Annotated[str, Path(pattern=TASK_ID_PATTERN, description="a task id")]
NO_NOTE = DecisionRequest()  # approve/reject without a body
_LOC_TAGS = frozenset({"Script", "str", "int", "float", "bool", "none", "ConstraintsPatch"})


def _responses(ok: int, model: type, *errors: int, description: str = "Success") -> dict[int, Any]:
    out: dict[int, Any] = {ok: {"description": description, "content": {JSON: {"model": model}}}}
    for status in (401, *errors):
        out[status] = {"description": _ERRORS[status], "content": {JSON: {"model": ErrorResponse}}}
    return out


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if field:
        err["field"] = field
    return {"error": err}


def _error(status: int, code: str, message: str, field: str | None = None) -> Response[Any]:
    return Response(status_code=status, content_type=JSON, body=json.dumps(error_body(code, message, field)))


def proxy_error(
    status: int, code: str, message: str, field: str | None = None, headers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """An API Gateway proxy response carrying an error (for answers given before routing)."""
    all_headers = {"Content-Type": JSON, **(headers or {})}
    return {
        "statusCode": status,
        "multiValueHeaders": {k: [v] for k, v in all_headers.items()},
        "body": json.dumps(error_body(code, message, field)),
        "isBase64Encoded": False,
    }


def field_path(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """A pydantic error location as the dotted path a caller wrote (``constraints.tools[0]``)."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and (part in _LOC_TAGS or part.startswith(_LOC_NOISE)):
            continue
        else:
            path += ("." if path else "") + str(part)
    return path or None


def describe_validation_error(error: Mapping[str, Any]) -> tuple[str, str | None]:
    """(message, field) for one pydantic error, in the words ``submit.parse_submission`` uses."""
    loc = tuple(error.get("loc", ()))
    field = field_path(loc)
    if loc and loc[0] == "body" and field is None:
        field = "body"
    kind = error.get("type", "")
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    head, sep, rest = message.partition(": ")
    if sep and head.isidentifier():  # a model-level check names its field as "field: message"
        field = ".".join(filter(None, [field if field != "body" else None, head]))
        message = rest
    name = field or "request"
    if kind == "missing":
        return f"{name} is required", field
    if kind == "extra_forbidden":
        return f"{name}: unknown field", field
    if kind == "model_attributes_type" and field == "body":
        return "the body must be a JSON object", field
    return f"{name}: {message}", field


def _body_bytes(event: Mapping[str, Any]) -> int:
    body = event.get("body") or ""
    if event.get("isBase64Encoded"):
        return len(body) * 3 // 4
    return len(body.encode())


def _builtin_script_only(script: Any) -> None:
    """Over HTTP a script is inline or a built-in name, never a path on the server: the
    scripted provider would read any file it names."""
    if isinstance(script, str) and script not in builtin_script_names():
        raise ValidationError(
            f"script: unknown script {script!r}; built-in scripts: {', '.join(builtin_script_names())} (or send the script inline)",
            field="script",
        )


def _header(event: Mapping[str, Any], name: str) -> str | None:
    for key, value in (event.get("headers") or {}).items():
        if key.lower() == name:
            return str(value)
    return None


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


def _event_tenant(event: Mapping[str, Any]) -> str | None:
    ctx = (event.get("requestContext") or {}).get("authorizer") or {}
    tenant = ctx.get("tenant") if isinstance(ctx, Mapping) else None
    return str(tenant) if tenant else None


@dataclass
class _RequestState:
    """What powertools keeps per request, for one request."""

    event: Any = None
    lambda_context: Any = None
    context: dict[str, Any] = field(default_factory=dict)
    processed_stack_frames: list[str] = field(default_factory=list)


class AgentqResolver(APIGatewayRestResolver):
    """The resolver plus the checks that must answer before a body is parsed: size and tenant.

    It answers concurrent requests from threads (the local server) without crossing them.
    powertools keeps the request being answered on the class (``BaseRouter.current_event``,
    one per process, as Lambda gives a process one event at a time) and the matched route's
    arguments in the instance's ``context``: two threads inside one resolver answered 500
    (``KeyError: '_route_args'``), named another request's task, and created tasks from another
    request's body and tenant. Here that state is a per-request record behind a ``ContextVar``,
    as powertools' own ASGI resolver (``HttpResolverLocal``) does, and the middleware stack a
    route builds on its first call is built by one thread only (two at once wrapped it twice).
    Routers included in the app reach the state through ``api_resolver``, so they are covered.
    """

    def __init__(self, default_tenant: str | None = None) -> None:
        self._startup = _RequestState()  # before super().__init__, which sets context
        self._request: ContextVar[_RequestState | None] = ContextVar("agentq_api_request", default=None)
        self._first_calls = threading.Lock()
        super().__init__(enable_validation=True)
        self.default_tenant = default_tenant

    @property
    def _state(self) -> _RequestState:
        return self._request.get() or self._startup

    @property
    def current_event(self) -> Any:
        return self._state.event

    @current_event.setter
    def current_event(self, value: Any) -> None:
        self._state.event = value

    @property
    def lambda_context(self) -> Any:
        return self._state.lambda_context

    @lambda_context.setter
    def lambda_context(self, value: Any) -> None:
        self._state.lambda_context = value

    @property
    def context(self) -> dict[str, Any]:
        return self._state.context

    @context.setter
    def context(self, value: dict[str, Any]) -> None:
        self._state.context = value

    @property
    def processed_stack_frames(self) -> list[str]:
        return self._state.processed_stack_frames

    @processed_stack_frames.setter
    def processed_stack_frames(self, value: list[str]) -> None:
        self._state.processed_stack_frames = value

    def resolve(self, event: Any, context: Any) -> dict[str, Any]:
        state = _RequestState(
            event=self._to_proxy_event(event), lambda_context=context, context=dict(self._startup.context)
        )
        token = self._request.set(state)
        try:
            return self._checked(event, context)
        finally:
            self._request.reset(token)

    def _checked(self, event: Any, context: Any) -> dict[str, Any]:
        if _body_bytes(event) > MAX_BODY_BYTES:
            return proxy_error(413, "body_too_large", f"request body over {MAX_BODY_BYTES} bytes", "body")
        content_type = _header(event, "content-type")
        if event.get("body") and content_type and not _is_json(content_type):
            return proxy_error(
                415, "unsupported_media_type", f"send the body as application/json, not {content_type}", "Content-Type"
            )
        path = str(event.get("path") or "")
        if path not in PUBLIC_PATHS and _event_tenant(event) is None and self.default_tenant is None:
            return proxy_error(
                401, "unauthorized", "send Authorization: Bearer <API key>", headers={"WWW-Authenticate": "Bearer"}
            )
        return super().resolve(event, context)

    def _call_route(self, route: Route, route_arguments: dict[str, str]) -> Any:
        if getattr(route, "_middleware_stack_built", False):
            return super()._call_route(route, route_arguments)
        with self._first_calls:  # the route builds its middleware stack in this call
            return super()._call_route(route, route_arguments)

    def tenant(self) -> str:
        tenant = _event_tenant(self.current_event.raw_event) or self.default_tenant
        assert tenant is not None  # resolve() answered 401 otherwise
        return tenant


def build_app(
    store: Storage,
    tools: ToolRegistry,
    queues: TaskQueues,
    fanout: Any = None,
    *,
    default_tenant: str | None = None,
    defaults: Defaults = Defaults(),
) -> AgentqResolver:
    """The API over ``store``. ``default_tenant`` serves requests that carry no authorizer
    context (never in AWS, where the authorizer always sets one; ``None`` answers 401).
    ``defaults`` fill the constraints a submission leaves out (the deployment's budget_defaults)."""
    app = AgentqResolver(default_tenant=default_tenant)
    app.configure_openapi(
        title="agentq",
        version=API_VERSION,
        description="A durable task queue for long-running AI agents. Every error is "
        '{"error": {"code", "message", "field"?}}.',
        security_schemes={"bearer": HTTPBearer(description="an agentq API key (agentq keys create)")},
        security=[{"bearer": []}],
    )
    tenant: Callable[[], str] = app.tenant
    openapi_cache: list[str] = []

    @app.get(
        "/health",
        summary="Liveness",
        operation_id="health",
        tags=["meta"],
        responses={200: {"description": "The API answers", "content": {JSON: {"model": Health}}}},
        openapi_extensions={"security": []},
    )
    def health() -> Health:
        return Health(status="ok", version=API_VERSION)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> Response[Any]:
        if not openapi_cache:
            openapi_cache.append(json.dumps(openapi_document(app)))
        return Response(status_code=200, content_type=JSON, body=openapi_cache[0])

    @app.post(
        "/tasks",
        summary="Submit a task",
        description="Validates fully, creates the task and queues it; 202 with its id. With an `Idempotency-Key` "
        "header the same key and body return the same task (`created: false`), the same key with another body 409.",
        operation_id="createTask",
        tags=["tasks"],
        responses=_responses(202, TaskAccepted, 400, 409, 413, 415, 422, description="Accepted and queued"),
    )
    def create_task(
        submission: Annotated[TaskSubmission, Body(description="goal, provider and model, constraints, priority")],
        idempotency_key: Annotated[
            str | None,
            Header(alias="Idempotency-Key", pattern=IDEMPOTENCY_KEY_PATTERN, description="retry-safe submits"),
        ] = None,
    ) -> Response[TaskAccepted]:
        who = tenant()
        _builtin_script_only(submission.script)
        digest = request_hash(submission)  # of the request as sent, before defaults fill it in
        accepted = submit_once(
            store,
            tools,
            defaults.apply(submission),
            tenant=who,
            queues=queues,
            idempotency_key=idempotency_key,
            digest=digest,
        )
        task, created = accepted.task, accepted.created
        headers = {"Location": f"/tasks/{task.task_id}"}
        if created:
            observe.record_submitted()
        else:
            headers["Idempotent-Replayed"] = "true"
        body = TaskAccepted(
            task_id=task.task_id, status=task.status, created=created, links=TaskLinks.for_task(task.task_id)
        )
        return Response(status_code=202, content_type=JSON, body=body, headers=headers)

    @app.get(
        "/tasks",
        summary="List tasks, newest first",
        operation_id="listTasks",
        tags=["tasks"],
        responses=_responses(200, TaskPage, 400, 422),
    )
    def list_tasks(
        status: Annotated[TaskStatus | None, Query(description="only tasks in this status")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="page size")] = DEFAULT_PAGE_SIZE,
        cursor: Annotated[str | None, Query(max_length=1024, description="next_cursor of the previous page")] = None,
        include_children: Annotated[bool, Query(description="also list sub-agents")] = False,
    ) -> TaskPage:
        if (
            status is None
            and app.current_event.query_string_parameters
            and "status" in app.current_event.query_string_parameters
        ):
            raise ValidationError("status: give one of the task statuses, or leave status out", field="status")
        return api_views.task_page(
            store, tenant(), limit=limit, cursor=cursor, status=status, include_children=include_children
        )

    @app.get(
        "/tasks/<task_id>",
        summary="A task's status",
        description="Status, step, tokens against the budget, cost, timestamps, children, latency, current activity.",
        operation_id="getTask",
        tags=["tasks"],
        responses=_responses(200, TaskView, 404, 422),
    )
    def get_task(task_id: TaskId) -> TaskView:
        return api_views.task_view(store, api_views.owned(store, task_id, tenant()))

    @app.get(
        "/tasks/<task_id>/result",
        summary="A finished task's result",
        description="409 task_not_finished until the task ends; `complete` is false for a partial result.",
        operation_id="getTaskResult",
        tags=["tasks"],
        responses=_responses(200, TaskResult, 404, 409, 422),
    )
    def get_result(task_id: TaskId) -> TaskResult:
        return api_views.task_result(api_views.owned(store, task_id, tenant()))

    @app.get(
        "/tasks/<task_id>/trace",
        summary="A task's trace, in commit order",
        description="LLM calls (model, tokens, timing), tool calls (input, output, duration), transitions "
        "and orphan LLM calls (paid for, never committed). Paginated.",
        operation_id="getTaskTrace",
        tags=["tasks"],
        responses=_responses(200, TracePage, 400, 404, 422),
    )
    def get_trace(
        task_id: TaskId,
        limit: Annotated[int, Query(ge=1, le=MAX_TRACE_PAGE, description="events per page")] = DEFAULT_TRACE_PAGE,
        cursor: Annotated[str | None, Query(max_length=1024, description="next_cursor of the previous page")] = None,
    ) -> TracePage:
        return api_views.trace_page(store, api_views.owned(store, task_id, tenant()), limit=limit, cursor=cursor)

    @app.post(
        "/tasks/<task_id>/cancel",
        summary="Cancel a task and its sub-agents",
        operation_id="cancelTask",
        tags=["control"],
        responses=_responses(200, CancelResult, 404, 409, 422),
    )
    def cancel_task(task_id: TaskId) -> CancelResult:
        cancelled = control.cancel(store, task_id, tenant=tenant(), fanout=fanout)
        return CancelResult(task_id=task_id, cancelled=cancelled)

    def _decide(task_id: str, decision: DecisionRequest, approved: bool) -> TaskView:
        who = tenant()
        task = control.decide(store, queues, task_id, approved=approved, note=decision.note, by=who, tenant=who)
        return api_views.task_view(store, task)

    @app.post(
        "/tasks/<task_id>/approve",
        summary="Approve a paused task's request",
        operation_id="approveTask",
        tags=["control"],
        responses=_responses(200, TaskView, 400, 404, 409, 413, 415, 422),
    )
    def approve(task_id: TaskId, decision: Annotated[DecisionRequest, Body()] = NO_NOTE) -> TaskView:
        return _decide(task_id, decision, True)

    @app.post(
        "/tasks/<task_id>/reject",
        summary="Reject a paused task's request",
        operation_id="rejectTask",
        tags=["control"],
        responses=_responses(200, TaskView, 400, 404, 409, 413, 415, 422),
    )
    def reject(task_id: TaskId, decision: Annotated[DecisionRequest, Body()] = NO_NOTE) -> TaskView:
        return _decide(task_id, decision, False)

    @app.post(
        "/tasks/<task_id>/budget",
        summary="Raise a root task's budget",
        description="A cost_exceeded task resumes from its checkpoint.",
        operation_id="raiseBudget",
        tags=["control"],
        responses=_responses(200, TaskView, 400, 404, 409, 413, 415, 422),
    )
    def budget(task_id: TaskId, raise_by: Annotated[BudgetRequest, Body()]) -> TaskView:
        task = control.raise_budget(
            store, queues, task_id, add_tokens=raise_by.add_tokens, add_steps=raise_by.add_steps, tenant=tenant()
        )
        return api_views.task_view(store, task)

    @app.post(
        "/tasks/<task_id>/fork",
        summary="Fork a task at a committed step",
        description="A new task from the source's steps 1..at_step (copied, never re-run), with any overrides.",
        operation_id="forkTask",
        tags=["control"],
        responses=_responses(202, TaskView, 400, 404, 409, 413, 415, 422, description="The new task, queued"),
    )
    def fork(task_id: TaskId, request: Annotated[ForkRequest, Body()]) -> Response[TaskView]:
        _builtin_script_only(request.script)
        new = control.fork(
            store, tools, queues, task_id, at_step=request.at_step, overrides=request.overrides(), tenant=tenant()
        )
        observe.record_submitted()
        headers = {"Location": f"/tasks/{new.task_id}"}
        return Response(status_code=202, content_type=JSON, body=api_views.task_view(store, new), headers=headers)

    # ------------------------------------------------------------ errors

    @app.exception_handler(RequestValidationError)
    def on_request_validation(exc: RequestValidationError) -> Response[Any]:
        errors = exc.errors()
        if any(e.get("loc", ("",))[0] == "response" for e in errors):
            log.error("response failed its own schema: %s", errors)
            return _error(500, "internal_error", "internal error; see the service logs")
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = next(e for e in errors if e.get("type") == "json_invalid")
            why = (detail.get("ctx") or {}).get("error", "")
            return _error(400, "invalid_json", f"body is not valid JSON: {why}".rstrip(": "), "body")
        message, field = describe_validation_error(errors[0] if errors else {})
        return _error(422, "validation_error", message, field)

    @app.exception_handler(ResponseValidationError)
    def on_response_validation(exc: ResponseValidationError) -> Response[Any]:
        log.error("response failed its own schema: %s", exc.errors())
        return _error(500, "internal_error", "internal error; see the service logs")

    @app.exception_handler(RequestUnsupportedContentType)
    def on_content_type(exc: RequestUnsupportedContentType) -> Response[Any]:
        return _error(415, "unsupported_media_type", "send the body as application/json", "Content-Type")

    @app.exception_handler(api_views.InvalidCursor)
    def on_cursor(exc: api_views.InvalidCursor) -> Response[Any]:
        return _error(400, exc.code, exc.message, exc.field)

    @app.exception_handler(ValidationError)
    def on_validation(exc: ValidationError) -> Response[Any]:
        return _error(422, exc.code, exc.message, exc.field)

    @app.exception_handler(TaskNotFound)
    def on_not_found(exc: TaskNotFound) -> Response[Any]:
        return _error(404, exc.code, exc.message, exc.field)

    @app.exception_handler([IllegalTransition, IdempotencyConflict, api_views.NotFinished])
    def on_conflict(exc: AgentqError) -> Response[Any]:
        return _error(409, exc.code, exc.message, exc.field)

    @app.exception_handler(AgentqError)
    def on_agentq(exc: AgentqError) -> Response[Any]:
        return _error(409, exc.code, exc.message, exc.field)

    @app.not_found
    def on_missing_route(exc: Exception) -> Response[Any]:
        method, path = app.current_event.http_method.upper(), app.current_event.path
        allowed = sorted({r.method for r in app._static_routes + app._dynamic_routes if r.rule.match(path)})
        if allowed:
            response = _error(405, "method_not_allowed", f"{path} answers {', '.join(allowed)}, not {method}")
            response.headers["Allow"] = ", ".join(allowed)
            return response
        return _error(404, "route_not_found", f"no route {method} {path}")

    @app.exception_handler(Exception)
    def on_unexpected(exc: Exception) -> Response[Any]:
        log.exception("unhandled error")
        return _error(500, "internal_error", "internal error; see the service logs")

    return app


def openapi_document(app: APIGatewayRestResolver) -> dict[str, Any]:
    """The OpenAPI document generated from the routes, minus what powertools adds that this API
    never answers: its own validation-error shapes (ours are ErrorResponse) and a 422 on
    routes that take no input."""
    doc: dict[str, Any] = json.loads(app.get_openapi_json_schema())
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            if not op.get("parameters") and not op.get("requestBody"):
                op.get("responses", {}).pop("422", None)
    schemas = doc.get("components", {}).get("schemas", {})
    while True:
        used = _refs({k: v for k, v in doc.items() if k != "components"}) | _refs(schemas)
        unused = [name for name in schemas if name not in used]
        if not unused:
            return doc
        for name in unused:
            del schemas[name]


def _refs(node: Any) -> set[str]:
    """Component names referenced under ``node``."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                found.add(ref.rsplit("/", 1)[1])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found
