"""``/a2a/{agent}``: each agent (``name`` or ``name@version``) as an A2A agent
(``api/a2a_server.py``), on the API's own routes with its auth, as ``/mcp`` is.

- ``GET /a2a/{agent}/.well-known/agent-card.json``: its Agent Card. Behind the same auth as every
  route: an agent is a tenant's, and the tenant is the key's. The card names that scheme (HTTP
  bearer: an API key, or a token of the deployment's OIDC issuer). It says what its reader may
  do: push notifications are the tenant's keys' (``api/a2a_push.py``), so an end user's token
  reads ``pushNotifications: false`` (and ``Vary: Authorization``: one reader's is not another's).
- ``POST /a2a/{agent}``: JSON-RPC 2.0, answered by the ``a2a-sdk``'s own dispatcher (parsing,
  method routing, the protocol's error codes, server-sent events), run as an ASGI app in an
  event loop of its own per request, its answer handed back to powertools. Where the server
  holds the connection (``api/live_stream.py``: the local server, and in AWS the streaming
  function this path is routed to, ``infra/api.py``), a stream (``SendStreamingMessage``,
  ``SubscribeToTask``) is written event by event as the task changes; in the API Lambda
  (one invocation answers once) it is sent whole when it ends (at most
  ``a2a_server.STREAM_SECONDS``), and ``SubscribeToTask`` resumes it.

What the API refuses before a route runs (a body over the size limit, not JSON, nesting too
deep) is answered on this path as a JSON-RPC error with the protocol's code (``rpc_refusal``),
not the REST error body an A2A client would not read. Not in the OpenAPI document: it speaks
JSON-RPC, not the REST API's shapes.
"""

from __future__ import annotations

import asyncio
import json
import re
from email.utils import formatdate
from typing import Any
from urllib.parse import quote

from aws_lambda_powertools.event_handler import Response

from agentq import __version__
from agentq.api.asgi_request import serve
from agentq.api.console import CONSOLE_PATH
from agentq.api.errors import JSON, error_response
from agentq.api.live_stream import live_var
from agentq.api.models.base import IDEMPOTENCY_KEY_PATTERN
from agentq.api.routes.common import ApiDeps, Router
from agentq.core.errors import AgentqError

CARD_PATH = "/.well-known/agent-card.json"
AGENT_REF = r"[a-z0-9][a-z0-9_-]{0,63}(@[1-9][0-9]{0,8})?"
RPC_PATH = re.compile(rf"^/a2a/{AGENT_REF}/?$")
PARSE_ERROR, INVALID_REQUEST, CONTENT_TYPE_NOT_SUPPORTED = -32700, -32600, -32005
CARD_MAX_AGE = 60  # seconds a client may keep a card: a new version of the agent is seen within a minute


def is_rpc_path(path: str) -> bool:
    return bool(RPC_PATH.match(path.split("?", 1)[0]))


def rpc_refusal(status: int, message: str) -> dict[str, Any]:
    """A refusal of the API's guard in JSON-RPC's words: a body that is not JSON (or not
    readable as it) is a parse error, a body not sent as JSON the protocol's
    ContentTypeNotSupported, anything else (too large, a member named twice) an invalid request; HTTP 200, as the SDK
    answers every JSON-RPC error, so a client reads it as the protocol's error."""
    code = {400: PARSE_ERROR, 415: CONTENT_TYPE_NOT_SUPPORTED}.get(status, INVALID_REQUEST)
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return {
        "statusCode": 200,
        "multiValueHeaders": {"Content-Type": [JSON]},
        "body": json.dumps(body),
        "isBase64Encoded": False,
    }


def router(deps: ApiDeps) -> Router:
    routes = Router()
    handler: list[Any] = []  # built on the first call: importing a2a-sdk costs the other routes nothing

    def agent_of(ref: str) -> Any:
        """The agent's version the path names (latest for a bare name), or 404."""
        if not re.fullmatch(AGENT_REF, ref):
            raise _NoAgent(ref)
        name, _, version = ref.partition("@")
        try:
            return deps.store.agents.get(deps.tenant(), name, int(version) if version else None)
        except AgentqError:
            raise _NoAgent(ref) from None

    @routes.get("/a2a/<agent>/.well-known/agent-card.json", include_in_schema=False)
    def card(agent: str) -> Response[str]:
        from a2a.server.request_handlers.response_helpers import agent_card_to_dict

        version = agent_of(agent)
        pushes = not deps.caller().bound  # a token sets no push config: its card says so
        built = agent_card(version, agent, _base_url(routes.current_event), push_notifications=pushes)
        body = json.dumps(agent_card_to_dict(built), sort_keys=True)
        headers = {
            "Cache-Control": f"private, max-age={CARD_MAX_AGE}",  # private: a tenant's card, behind its key
            "Vary": "Authorization",  # a key's card and a token's differ (push notifications)
            "Last-Modified": formatdate(version.created_at, usegmt=True),  # versions never change
            # and the API's conditional GET (api/conditional.py) adds its ETag, answering If-None-Match with 304
        }
        return Response(status_code=200, content_type=JSON, body=body, headers=headers)

    @routes.post("/a2a/<agent>", include_in_schema=False)
    def rpc(agent: str) -> Response[str]:
        from agentq.api.a2a_server import Call, build_handler, call_var

        agent_of(agent)
        if not handler:
            handler.append(_asgi_app(build_handler(deps)))
        event = routes.current_event
        body = (event.decoded_body or "").encode()
        headers = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (event.headers or {}).items()]
        given = {k.lower(): v for k, v in (event.headers or {}).items()}.get("idempotency-key")
        if given is not None and not re.fullmatch(IDEMPOTENCY_KEY_PATTERN, given):
            refusal = rpc_refusal(413, "Idempotency-Key: 1-255 visible ASCII characters")  # an invalid request
            return Response(status_code=200, content_type=JSON, body=refusal["body"])
        base = _base_url(event)
        token = call_var.set(Call(deps.caller(), agent, given, base if len(base) <= 1024 else ""))  # a metadata value
        live = live_var.get()
        try:
            status, out, payload = asyncio.run(_serve(handler[0], headers, body, live))
        except Exception:
            if live is None or not live.started:
                raise
            # The stream was under way (the client hung up, or the app failed mid-stream): what
            # was sent stands, and the server sends nothing more on this connection.
            return Response(status_code=200, content_type=JSON, body="")
        finally:
            call_var.reset(token)
        content_type = out.pop("content-type", JSON)
        return Response(status_code=status, content_type=content_type, body=payload.decode(), headers=out)

    @routes.exception_handler(_NoAgent)
    def no_agent(exc: _NoAgent) -> Response[Any]:
        return error_response(404, "agent_not_found", f"no agent {exc.ref!r} here", "agent")

    return routes


class _NoAgent(Exception):
    def __init__(self, ref: str) -> None:
        super().__init__(ref)
        self.ref = ref


def agent_card(version: Any, ref: str, base: str, *, push_notifications: bool = True) -> Any:
    """The Agent Card of an agent's version: one skill, the agent itself (its tools as tags);
    the API's bearer auth; streaming (event by event, resumed by ``SubscribeToTask``); push
    notifications (``api/a2a_push.py``) unless its reader is an end user's token; no extended
    card (a card per reader needs none: the card itself is behind the caller's auth)."""
    from a2a.types import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        AgentProvider,
        AgentSkill,
        HTTPAuthSecurityScheme,
        SecurityRequirement,
        SecurityScheme,
    )

    from agentq.api.a2a_views import JSON_TYPE, TEXT

    output = [JSON_TYPE] if version.output_schema is not None else [TEXT]
    description = version.description or f"agentq agent {version.name} (version {version.version})"
    skill = AgentSkill(id=version.name, name=version.name, description=description,
                       tags=["agentq", *version.tools], input_modes=[TEXT, JSON_TYPE], output_modes=output)  # fmt: skip
    scheme = SecurityScheme(
        http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="bearer", description="an agentq API key, or a token of the deployment's OIDC issuer"
        )
    )
    requirement = SecurityRequirement()
    requirement.schemes["bearer"].SetInParent()
    return AgentCard(
        name=version.name,
        description=description,
        version=str(version.version),
        supported_interfaces=[
            AgentInterface(url=f"{base}/a2a/{ref}", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        provider=AgentProvider(organization="agentq", url=base),
        capabilities=AgentCapabilities(
            streaming=True, push_notifications=push_notifications, extended_agent_card=False
        ),
        security_schemes={"bearer": scheme},
        security_requirements=[requirement],
        default_input_modes=[TEXT, JSON_TYPE],
        default_output_modes=output,
        skills=[skill],
        documentation_url=f"{base}{CONSOLE_PATH}#/agents/{quote(version.name, safe='')}",  # the agent's console page
        icon_url="",
    )


def _base_url(event: Any) -> str:
    """Where the caller reached the API: its Host and scheme, and API Gateway's stage (in AWS
    the path the route sees has it removed)."""
    headers = {k.lower(): v for k, v in (event.headers or {}).items()}
    host = headers.get("host", "localhost")
    scheme = headers.get("x-forwarded-proto", "http" if host.startswith(("127.", "localhost")) else "https")
    context = event.raw_event.get("requestContext") or {}
    full = str(context.get("path") or event.path)
    prefix = full[: len(full) - len(event.path)] if full.endswith(event.path) else ""
    return f"{scheme}://{host}{prefix}"


def _asgi_app(request_handler: Any) -> Any:
    from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
    from starlette.applications import Starlette

    return Starlette(routes=create_jsonrpc_routes(request_handler, rpc_url="/"))


async def _serve(
    app: Any, headers: list[tuple[bytes, bytes]], body: bytes, live: Any
) -> tuple[int, dict[str, str], bytes]:
    """One request through the SDK's ASGI app: the whole answer collected, or a stream's written
    to ``live`` as it happens."""
    extra = {"a2a-server": f"agentq/{__version__}"}
    return await serve(app, method="POST", path="/", headers=headers, body=body, live=live, extra=extra, app=app)
