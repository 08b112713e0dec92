"""Every error the HTTP API answers has one shape, ``{"error": {"code", "message", "field"?}}``,
and this module is where it is made: the body, the status each error of the core maps to
(``handlers``), and the words for a pydantic validation error, which name the field the caller
wrote (``constraints.tools[0]``), not pydantic's location tags.

- 400 the request cannot be read: ``invalid_json``, ``invalid_cursor``, ``invalid_path`` (a path
  segment whose escapes are not UTF-8)
- 401 ``unauthorized``: no tenant (no valid ``Authorization: Bearer <key>``)
- 403 ``forbidden``: the key is valid but not allowed this (an operator's route, a tenant's key);
  ``not_the_approver``: an end user's token deciding a held call only its tenant decides
- 404 ``task_not_found`` (another tenant's task too: no oracle), ``route_not_found``;
  405 ``method_not_allowed`` (with ``Allow``)
- 409 ``illegal_transition`` (the task's state forbids it), ``idempotency_conflict``,
  ``task_not_finished``
- 413 ``body_too_large``; 415 ``unsupported_media_type`` (a body not sent as application/json)
- 414 ``uri_too_long``, 431 ``headers_too_large``: the server's, before any route (documented on
  every operation); the local server also answers 421, 411, 408 and 400 about the transport
  itself (``api/http_guard.py``)
- 422 ``validation_error``: a field's value is invalid; ``field`` names it
- 423 ``scope_stopped``: the request would start work in a stopped scope (``agentq stop``); the
  body's ``error.scope`` names it (``kind``, ``value``) and ``field`` its kind
- 500 ``internal_error``: never with a stack trace; the service log has it

The answers given before routing (413, 415, 401) and after it (404/405 for an unknown route)
are the resolver's (``agentq.api.app``); they use the same body.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
    ResponseValidationError,
)

from agentq.api import views as api_views
from agentq.api.models import MAX_BODY_BYTES, MESSAGE_ID_PATTERN, ErrorResponse
from agentq.api.routes.common import Router
from agentq.core.caps import CapNotFound
from agentq.core.endusers import NotTheApprover, UserMayNot, UserNotAllowed
from agentq.core.errors import (
    AgentqError,
    IdempotencyConflict,
    IllegalTransition,
    MessageRefused,
    TaskNotFound,
    ValidationError,
)
from agentq.core.memory import (
    MEMORY_STORE_PATTERN,
    MemoryConflict,
    MemoryDocumentNotFound,
    MemoryLimitExceeded,
    MemoryStoreNotFound,
)
from agentq.core.stops import NAME_RULE, SCOPE_RULES, VALUE_PATTERNS, ScopeNotYours, ScopeStopped, StopNotFound
from agentq.core.vault import VaultUnavailable
from agentq.storage.agent_aliases import AliasNotFound
from agentq.storage.agents import AgentConflict, AgentNotFound
from agentq.storage.api_keys import KeyNotFound
from agentq.storage.policies import PolicyNotFound

log = logging.getLogger("agentq.api")

JSON = "application/json"

DESCRIPTIONS = {
    400: "The request cannot be read (invalid_json, invalid_cursor)",
    401: "No valid API key (unauthorized)",
    403: "The key may not do this (forbidden): the message says why",
    404: "No such task for this tenant (task_not_found)",
    405: "Wrong method for this path (method_not_allowed; Allow lists the right ones)",
    409: "The task's state forbids it (illegal_transition, idempotency_conflict, task_not_finished)",
    413: f"Request body over {MAX_BODY_BYTES} bytes (body_too_large)",
    415: "Request body not sent as application/json (unsupported_media_type)",
    422: "A field is invalid (validation_error); `field` names it",
    423: "The scope is stopped (scope_stopped): `error.scope` names it; nothing starts in it until it is resumed",
    414: "Request line (method, path and query) over 64 KiB (uri_too_long)",
    431: "Over 100 headers, or a header line over 64 KiB (headers_too_large)",
    503: "This deployment has no vault key (vault_unavailable)",
}
# What the server answers whatever the route, before it is known: every operation documents them.
TRANSPORT_ERRORS = (414, 431)
# Type tags pydantic puts in an error location (union members, validators): not field names.
_LOC_NOISE = ("function-", "constrained-", "list[", "dict[", "json-or-python[", "nullable[", "union[", "tagged-union[")
_LOC_TAGS = frozenset({"Script", "str", "int", "float", "bool", "none", "ConstraintsPatch"})


class Forbidden(AgentqError):
    """A valid key asking for what only another kind of key may have (403)."""

    code = "forbidden"


def responses(ok: int, model: type, *errors: int, description: str = "Success") -> dict[int, Any]:
    """A route's documented answers: ``ok`` with ``model``, 401 (every route but the public
    ones needs a key) and ``errors``, each with the error body."""
    out: dict[int, Any] = {ok: {"description": description, "content": {JSON: {"model": model}}}}
    for status in (401, *errors):
        out[status] = {"description": DESCRIPTIONS[status], "content": {JSON: {"model": ErrorResponse}}}
    return out


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if field:
        err["field"] = field
    return {"error": err}


def error_response(status: int, code: str, message: str, field: str | None = None) -> Response[Any]:
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
    pattern = (error.get("ctx") or {}).get("pattern") if kind == "string_pattern_mismatch" else None
    named = next((str(part) for part in reversed(loc) if isinstance(part, str)), "")
    rule = FIELD_RULES.get((str(pattern), named)) or PATTERN_RULES.get(str(pattern))
    if rule is not None:  # a user, agent, store, key or tenant name: its rule in words, not the regex
        return f"{name}: {rule}, not {error.get('input')!r}", field
    bound = _QUERY_BOUNDS.get(kind) if loc and loc[0] == "query" else None
    if bound is not None:  # ?limit=1000: say the bound, in the caller's terms
        return f"{name}: {bound.format(**(error.get('ctx') or {}))}, not {error.get('input')}", field
    return f"{name}: {message}", field


# A pattern whose rule has words, said instead of pydantic's "String should match pattern
# '^[A-Za-z0-9][A-Za-z0-9._@+:|-]{0,127}$'". One pattern may be several concepts': an agent's, a
# memory store's and a credential's names are the same, so a pattern alone is said in words true
# of every field of it (its shape: "name: 1-64 lowercase letters ..."), and a field whose name
# says its concept (a stop's ``agent``, an attachment's ``store``) in that concept's words. Keyed
# by the pattern alone, a memory store's name was refused as "an agent's name".
PATTERN_RULES = {
    VALUE_PATTERNS["tenant"]: SCOPE_RULES["tenant"],
    VALUE_PATTERNS["user"]: SCOPE_RULES["user"],
    VALUE_PATTERNS["agent"]: NAME_RULE,
    VALUE_PATTERNS["key"]: SCOPE_RULES["key"],
}
FIELD_RULES = {(VALUE_PATTERNS[kind], kind): rule for kind, rule in SCOPE_RULES.items()} | {
    (MEMORY_STORE_PATTERN, "store"): f"a memory store's name: {NAME_RULE}",
    (MESSAGE_ID_PATTERN, "message_ids"): "a dead letter's message_id as GET /dead-letters lists it",
}

# A query parameter out of its range: pydantic's words ("Input should be less than or equal
# to 100") replaced by the bound itself.
_QUERY_BOUNDS = {
    "less_than_equal": "at most {le}",
    "greater_than_equal": "at least {ge}",
    "less_than": "less than {lt}",
    "greater_than": "more than {gt}",
}


def internal_error() -> Response[Any]:
    return error_response(500, "internal_error", "internal error; see the service logs")


def handlers() -> Router:
    """The exception handlers, as a router to include: each maps an error a route raises (the
    core's, the pagination cursor's, powertools' validation) to its status and body."""
    router = Router()

    @router.exception_handler(RequestValidationError)
    def on_request_validation(exc: RequestValidationError) -> Response[Any]:
        errors = exc.errors()
        if any(e.get("loc", ("",))[0] == "response" for e in errors):
            log.error("response failed its own schema: %s", errors)
            return internal_error()
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = next(e for e in errors if e.get("type") == "json_invalid")
            why = (detail.get("ctx") or {}).get("error", "")
            return error_response(400, "invalid_json", f"body is not valid JSON: {why}".rstrip(": "), "body")
        message, field = describe_validation_error(errors[0] if errors else {})
        return error_response(422, "validation_error", message, field)

    @router.exception_handler(ResponseValidationError)
    def on_response_validation(exc: ResponseValidationError) -> Response[Any]:
        log.error("response failed its own schema: %s", exc.errors())
        return internal_error()

    @router.exception_handler(RequestUnsupportedContentType)
    def on_content_type(exc: RequestUnsupportedContentType) -> Response[Any]:
        return error_response(415, "unsupported_media_type", "send the body as application/json", "Content-Type")

    @router.exception_handler(api_views.InvalidCursor)
    def on_cursor(exc: api_views.InvalidCursor) -> Response[Any]:
        return error_response(400, exc.code, exc.message, exc.field)

    @router.exception_handler(ValidationError)
    def on_validation(exc: ValidationError) -> Response[Any]:
        return error_response(422, exc.code, exc.message, exc.field)

    @router.exception_handler(MemoryLimitExceeded)
    def on_limit(exc: MemoryLimitExceeded) -> Response[Any]:
        return error_response(422, exc.code, exc.message, exc.field)

    @router.exception_handler(VaultUnavailable)
    def on_vault_unavailable(exc: VaultUnavailable) -> Response[Any]:
        return error_response(503, exc.code, exc.message, exc.field)

    @router.exception_handler([Forbidden, UserNotAllowed, UserMayNot, ScopeNotYours, NotTheApprover])
    def on_forbidden(exc: AgentqError) -> Response[Any]:
        return error_response(403, exc.code, exc.message, exc.field)

    @router.exception_handler(
        [
            TaskNotFound,
            AgentNotFound,
            AliasNotFound,
            PolicyNotFound,
            MemoryStoreNotFound,
            MemoryDocumentNotFound,
            KeyNotFound,
            StopNotFound,
            CapNotFound,
        ]
    )
    def on_not_found(exc: AgentqError) -> Response[Any]:
        return error_response(404, exc.code, exc.message, exc.field)

    @router.exception_handler(
        [IllegalTransition, IdempotencyConflict, MessageRefused, AgentConflict, MemoryConflict, api_views.NotFinished]
    )
    def on_conflict(exc: AgentqError) -> Response[Any]:
        return error_response(409, exc.code, exc.message, exc.field)

    @router.exception_handler(ScopeStopped)
    def on_stopped(exc: ScopeStopped) -> Response[Any]:
        return Response(status_code=423, content_type=JSON, body=json.dumps({"error": exc.to_dict()}))

    @router.exception_handler(AgentqError)
    def on_agentq(exc: AgentqError) -> Response[Any]:
        return error_response(409, exc.code, exc.message, exc.field)

    @router.exception_handler(Exception)
    def on_unexpected(exc: Exception) -> Response[Any]:
        log.exception("unhandled error")
        return internal_error()

    return router
