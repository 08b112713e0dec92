"""The HTTP API as a powertools REST resolver: the same app behind API Gateway and `agentq dev`.

This module is the resolver and its assembly; the routes are in ``agentq.api.routes`` (one
router per area) and every error answer in ``agentq.api.errors``. Routes validate with
pydantic (``api.models``) and the OpenAPI document at ``/openapi.json`` is generated from them.

The resolver itself answers what must be decided before a body is parsed or a route runs:
413 (body too large), 415 (a body not sent as ``application/json``, or sent without a
``Content-Type``), 401 (no tenant), 400 (a path segment whose escapes are not UTF-8), and after
routing 404/405 for a path or method no route serves (a HEAD is answered as its GET, without the body). Routes match the path as sent, still
percent-encoded (as API Gateway's REST proxy event carries it); each route parameter is decoded
after the match, so an encoded ``/`` stays inside its parameter.

The tenant comes from the authorizer context (``requestContext.authorizer.tenant``): API
Gateway's Lambda authorizer puts it there, and the local server does the same in-process.
So does ``operator`` (the key may read every tenant's usage): API Gateway hands it on as the
string ``"true"``, the local server as a boolean; anything else is not an operator. A JWT's
context names the ``user`` the request acts as (``core.endusers.Caller``): such a caller reaches
only ``USER_PATHS`` (its own tasks; 403 elsewhere), and a key's ``act_for_users`` says whether
its requests may name a user.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from re import Match
from typing import Any, TypeVar
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.api_gateway import Route
from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer

from agentq.api import console, errors, route_input
from agentq.api.auth import caller_of
from agentq.api.body_guard import BodyProblem, check_body
from agentq.api.errors import JSON, error_response, proxy_error
from agentq.api.models.base import body_limit
from agentq.api.routes import a2a as a2a_route
from agentq.api.routes import (
    actions,
    agent_aliases,
    agents,
    caps,
    conversations,
    dead_letters,
    events,
    files,
    memory,
    meta,
    policies,
    schedules,
    stops,
    tasks,
    usage,
    vault,
    webhooks,
)
from agentq.api.routes import mcp as mcp_route
from agentq.api.routes.common import ApiDeps
from agentq.control.defaults import Defaults
from agentq.core.endusers import Caller
from agentq.core.tools import ToolRegistry
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage

API_VERSION = "1.0.0"
PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})  # answered without a tenant


def _body_bytes(event: Mapping[str, Any]) -> int:
    body = event.get("body") or ""
    if event.get("isBase64Encoded"):
        return len(body) * 3 // 4
    return len(body.encode())


def _header(event: Mapping[str, Any], name: str) -> str | None:
    for key, value in (event.get("headers") or {}).items():
        if key.lower() == name:
            return str(value)
    return None


def _undecodable(segment: str) -> bool:
    """Whether a path segment's percent-escapes are not UTF-8 (``caf%E9``): refused (400), never
    decoded into a replacement character."""
    try:
        unquote(segment, errors="strict")
    except UnicodeDecodeError:
        return True
    return False


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


def _json_media_said_so(event: Any) -> Any:
    """``event`` with a JSON ``Content-Type`` written as ``application/json`` (its parameters
    kept). RFC 9110 8.3.1: a media type's type and subtype are case-insensitive, and
    ``application/<x>+json`` is JSON too (``_is_json``); powertools parses a body only when the
    header starts with ``application/json`` as written, and answered ``Application/JSON`` or
    ``application/vnd.x+json`` with its own 415 after ``_guarded`` had let them through."""
    content_type = _header(event, "content-type") if isinstance(event, Mapping) else None
    if content_type is None or not _is_json(content_type):
        return event
    _, sep, params = content_type.partition(";")
    said = JSON + (f";{params}" if sep else "")
    if said == content_type:
        return event
    normal = dict(event)
    normal["headers"] = {k: said if k.lower() == "content-type" else v for k, v in event["headers"].items()}
    if event.get("multiValueHeaders"):
        normal["multiValueHeaders"] = {
            k: [said] if k.lower() == "content-type" else v for k, v in event["multiValueHeaders"].items()
        }
    return normal


def is_public(path: str) -> bool:
    """Answered without a tenant: liveness, the OpenAPI document, the console's pages (no data)."""
    return path in PUBLIC_PATHS or console.is_console(path)


def _event_caller(event: Mapping[str, Any]) -> Caller | None:
    return caller_of((event.get("requestContext") or {}).get("authorizer"))


# What a caller acting as one end user (a JWT's, ``core.endusers.Caller.bound``) may reach: its
# own tasks and what concerns them, its own usage, fleet health, its own vault, and the A2A and MCP
# servers (whose calls act as the user and read only its tasks: ``api.a2a_server``,
# ``api.mcp_server``); and it may read the agents' definitions it runs. Everything else acts for
# the whole tenant (agents' writes, aliases and quality reports, memory stores, schedules, caps,
# stops, policies, the callback secret, dead letters) and answers 403. Each route is named, never
# a prefix (``/agents(/.*)?`` let a token read ``/agents/{name}/quality``, every user's graded
# tasks, added after it was written): a route added later is closed to such callers until it is
# listed here (tests/test_end_user_auth.py::TOKEN_ROUTES lists what these admit). A path segment
# is ``[^/]+`` as the router's own parameters are (``%2F`` stays in its segment); a trailing ``/``
# reaches the same route, so it is allowed.
_TASK_ROUTES = r"result|trace|events|files|diff|messages|cancel|approve|reject|budget|fork|interrupt|close|agent"
USER_PATHS = re.compile(
    rf"(/tasks(/[^/]+(/({_TASK_ROUTES})|/files/.+|/compare/[^/]+)?)?"  # each answers 404 for another's task
    r"|/usage(/spend)?|/breakers|/vault/credentials(/[^/]+)?"
    r"|/a2a/[^/]+(/\.well-known/agent-card\.json)?|/mcp)/?"
)
USER_READS = re.compile(r"/agents(/[^/]+(/versions)?)?/?")  # definitions: not aliases, not quality


def user_may(method: str, path: str) -> bool:
    """Whether a caller bound to one end user may send ``method`` to ``path``."""
    return USER_PATHS.fullmatch(path) is not None or (method == "GET" and USER_READS.fullmatch(path) is not None)


_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass
class _RequestState:
    """What powertools keeps per request, for one request."""

    event: Any = None
    lambda_context: Any = None
    context: dict[str, Any] = field(default_factory=dict)
    processed_stack_frames: list[str] = field(default_factory=list)
    head: bool = False  # a HEAD, answered as its GET without the body


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
        event = _json_media_said_so(event)
        # RFC 9110 9.3.2: a server that answers GET answers HEAD too, with the GET's status and
        # headers (its ETag included) and no body. Answered as the GET it asks about: the same
        # checks (a token's reads), the same route, then the body dropped.
        head = isinstance(event, Mapping) and str(event.get("httpMethod") or "").upper() == "HEAD"
        if head:
            event = {**event, "httpMethod": "GET"}
        state = _RequestState(
            event=self._to_proxy_event(event), lambda_context=context, context=dict(self._startup.context), head=head
        )
        token = self._request.set(state)
        try:
            answer = self._checked(event, context)
        finally:
            self._request.reset(token)
        return {**answer, "body": "", "isBase64Encoded": False} if head else answer

    def _checked(self, event: Any, context: Any) -> dict[str, Any]:
        answer = self._guarded(event, context)
        refused = answer is not None and answer.get("statusCode") in (400, 413, 415, 422)
        path = str(event.get("path") or "")
        if refused and answer is not None and a2a_route.is_rpc_path(path):
            # in JSON-RPC's words for an A2A client
            return a2a_route.rpc_refusal(int(answer["statusCode"]), json.loads(answer["body"])["error"]["message"])
        answer = answer if answer is not None else super().resolve(event, context)
        # An MCP client reads JSON-RPC errors only: each of agentq's own in its words, status kept
        return mcp_route.proxy_in_rpc_words(answer, event) if mcp_route.is_mcp_path(path) else answer

    def _guarded(self, event: Any, context: Any) -> dict[str, Any] | None:
        """The refusal of a request no route may see (too large, not JSON, no tenant), or None."""
        limit = body_limit(str(event.get("path") or ""))
        if _body_bytes(event) > limit:
            return proxy_error(413, "body_too_large", f"request body over {limit} bytes", "body")
        content_type = _header(event, "content-type")
        if event.get("body") and not _is_json(content_type or ""):
            # A body without a Content-Type too: a browser's form or text/plain post (which a
            # web page may send anywhere without a CORS preflight) never reaches a route.
            said = f"not {content_type}" if content_type else "and say so in Content-Type"
            return proxy_error(
                415, "unsupported_media_type", f"send the body as application/json, {said}", "Content-Type"
            )
        path = str(event.get("path") or "")
        caller = _event_caller(event)
        if not is_public(path) and caller is None and self.default_tenant is None:
            return proxy_error(
                401, "unauthorized", "send Authorization: Bearer <API key>", headers={"WWW-Authenticate": "Bearer"}
            )
        if caller is not None and caller.bound and not is_public(path):
            method = str(event.get("httpMethod") or "GET").upper()
            if not user_may(method, path):
                return proxy_error(403, "forbidden", f"{method} {path} acts for the whole tenant: send an API key, "
                                   "not an end user's token")  # fmt: skip
        undecodable = next((s for s in path.split("/") if _undecodable(s)), None)
        if undecodable is not None:
            return proxy_error(
                400, "invalid_path", f"path segment {undecodable!r} is not percent-encoded UTF-8", "path"
            )
        try:
            check_body(event)
        except BodyProblem as problem:
            code = "invalid_body" if problem.status == 400 else "duplicate_field"
            return proxy_error(problem.status, code, problem.message, problem.field)
        return None

    def _convert_matches_into_route_keys(self, match: Match[str]) -> dict[str, str]:
        """The route's parameters, each percent-decoded once the path has been split: the path
        is matched as sent (API Gateway's REST proxy event keeps its encoding), so ``%2F`` stays
        inside its segment (``/tasks/a%2Fresult`` is task ``a/result``, refused by its pattern,
        never ``/tasks/a/result``)."""
        return {name: unquote(value, errors="strict") for name, value in match.groupdict().items()}

    def exception_handler(self, exc_class: type[Exception] | list[type[Exception]]) -> Callable[[_F], _F]:
        """powertools' own, typed: it registers the function and returns it unchanged."""
        register: Callable[[_F], _F] = super().exception_handler(exc_class)
        return register

    def _call_route(self, route: Route, route_arguments: dict[str, str]) -> Any:
        # Only a route the app registered: powertools calls its own catch-all route (a fresh
        # Route matching every path, which takes no body) to answer a path or method no route
        # serves, and checking the body there answered `POST /task {"goal": ...}` with 422
        # "goal: unknown field" instead of missing_route()'s 404/405.
        registered = any(route is r for r in self._static_routes) or any(route is r for r in self._dynamic_routes)
        refused = route_input.refusal(route, self.current_event.raw_event) if registered else None
        if refused is not None:  # a query parameter or a body the route does not take
            return self._response_builder_class(
                response=error_response(*refused), serializer=self._serializer, route=route
            )
        if getattr(route, "_middleware_stack_built", False):
            return super()._call_route(route, route_arguments)
        with self._first_calls:  # the route builds its middleware stack in this call
            return super()._call_route(route, route_arguments)

    def caller(self) -> Caller:
        """Who the current request acts for: its authorizer context's tenant (and user), or the
        default tenant's keyless caller, who may act for any user."""
        caller = _event_caller(self.current_event.raw_event)
        if caller is None:
            assert self.default_tenant is not None  # resolve() answered 401 otherwise
            return Caller(self.default_tenant, names_users=True)
        return caller

    def tenant(self) -> str:
        return self.caller().tenant

    def operator(self) -> bool:
        """Whether the current request's key is an operator's (see the module)."""
        return self.caller().operator

    def missing_route(self) -> Response[Any]:
        """405 with ``Allow`` when another method serves the path, else 404."""
        method, path = "HEAD" if self._state.head else self.current_event.http_method.upper(), self.current_event.path
        served = {r.method for r in self._static_routes + self._dynamic_routes if r.rule.match(path)}
        allowed = sorted(served | {"HEAD"} if "GET" in served else served)
        if allowed:
            response = error_response(405, "method_not_allowed", f"{path} answers {', '.join(allowed)}, not {method}")
            response.headers["Allow"] = ", ".join(allowed)
            return response
        return error_response(404, "route_not_found", f"no route {method} {path}")


def build_app(
    store: Storage,
    tools: ToolRegistry,
    queues: TaskQueues,
    fanout: Any = None,
    *,
    default_tenant: str | None = None,
    defaults: Defaults | None = None,
    mcp: Any = None,
    cipher: Any = None,
    hub_url: str | None = None,
) -> AgentqResolver:
    """The API over ``store``. ``default_tenant`` serves requests that carry no authorizer
    context (never in AWS, where the authorizer always sets one; ``None`` answers 401).
    ``defaults`` fill the constraints a submission leaves out (the deployment's budget_defaults);
    ``mcp`` are the MCP servers an agent may name (default: ``AGENTQ_MCP_SERVERS``); ``cipher``
    seals the vault's credentials (``runtime.build_cipher``; None: a write is 503); ``hub_url``
    the events hub that ``GET /health`` names (default: ``AGENTQ_EVENTS_HUB_URL``; none: the
    deployment serves watchers on ``GET /tasks/{id}/events`` only)."""
    app = AgentqResolver(default_tenant=default_tenant)
    app.configure_openapi(
        title="agentq",
        version=API_VERSION,
        description="A durable task queue for long-running AI agents. Every error is "
        '{"error": {"code", "message", "field"?}}.',
        security_schemes={"bearer": HTTPBearer(description="an agentq API key (agentq keys create)")},
        security=[{"bearer": []}],
    )
    if mcp is None:
        from agentq.core.tools.mcp import McpServers

        mcp = McpServers.from_env()
    deps = ApiDeps(
        store=store,
        tools=tools,
        queues=queues,
        fanout=fanout,
        defaults=defaults or Defaults(),
        tenant=app.tenant,
        operator=app.operator,
        caller=app.caller,
        mcp=mcp,
    )
    # The order of inclusion is the order of the paths in the OpenAPI document.
    hub_url = hub_url or os.environ.get("AGENTQ_EVENTS_HUB_URL") or None
    app.include_router(meta.router(API_VERSION, document=lambda: openapi_document(app), hub_url=hub_url))
    app.include_router(tasks.router(deps))
    app.include_router(files.router(deps))
    files.widen(app)
    app.include_router(events.router(deps))
    app.include_router(actions.router(deps))
    app.include_router(conversations.router(deps))
    app.include_router(agents.router(deps))
    app.include_router(agent_aliases.router(deps))
    app.include_router(policies.router(deps))
    app.include_router(stops.router(deps))
    app.include_router(memory.router(deps))
    app.include_router(mcp_route.router(deps))
    app.include_router(a2a_route.router(deps))
    app.include_router(webhooks.router(deps))
    app.include_router(schedules.router(deps))
    app.include_router(usage.router(deps))
    app.include_router(caps.router(deps))
    app.include_router(vault.router(deps, cipher))
    app.include_router(dead_letters.router(store, queues, app.tenant))
    console.install(app, hub_url)
    app.include_router(errors.handlers())
    app.not_found(lambda exc: app.missing_route())
    return app


def openapi_document(app: APIGatewayRestResolver) -> dict[str, Any]:
    """The OpenAPI document generated from the routes, minus what powertools adds that this API
    never answers: its own validation-error shapes (ours are ErrorResponse) and a 422 on
    routes that take no input."""
    doc: dict[str, Any] = json.loads(app.get_openapi_json_schema())
    error = {"$ref": "#/components/schemas/ErrorResponse"}
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            if not op.get("parameters") and not op.get("requestBody"):
                op.get("responses", {}).pop("422", None)
            for status in errors.TRANSPORT_ERRORS:  # the server's own, before any route: JSON too
                op.setdefault("responses", {})[str(status)] = {
                    "description": errors.DESCRIPTIONS[status],
                    "content": {JSON: {"schema": error}},
                }
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
