"""``/mcp``: agentq's MCP server (``api.mcp_server``) on the API's own route, with its auth.

The ``mcp`` package serves streamable HTTP as an ASGI app; here it runs in **stateless JSON
mode** (each POST a whole JSON-RPC exchange answered with ``application/json``, no session, no
SSE stream), so one API Gateway request is one Lambda invocation: the same API Lambda, behind the
same TOKEN authorizer (a tenant's API key), with no connection to keep and no session that
another Lambda instance would not know. The route hands the request to the ASGI app in an event
loop of its own and the ASGI answer back to powertools. Not in the OpenAPI document: it speaks
JSON-RPC, not the REST API's shapes.

What agentq itself refuses on ``/mcp`` before the ``mcp`` package sees the request (the key, the
body's size, its media type, JSON no parser takes whole: ``api.app``, ``api.http_guard``,
``api.gateway_proxy``) is answered in JSON-RPC's words (``in_rpc_words``), with its HTTP status
and headers kept (401 with ``WWW-Authenticate: Bearer``, as the MCP spec's auth asks). The
``mcp`` package's client surfaces a JSON-RPC error from the body of a non-2xx answer as an
``MCPError`` with its message; from the REST API's ``{"error": {...}}`` it read only "Server
returned an error response", and the caller never learnt which guard refused it, or why.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools.event_handler import Response

from agentq.api.asgi_request import serve
from agentq.api.models.base import MAX_BODY_BYTES
from agentq.api.routes.common import ApiDeps, Router

MCP_PATH = re.compile(r"/mcp/?")
PARSE_ERROR, INVALID_REQUEST, INTERNAL_ERROR = -32700, -32600, -32603  # JSON-RPC 2.0's codes
_UNPARSED = frozenset({"invalid_body", "invalid_json"})  # agentq's codes for JSON no parser takes

_NO_STREAM = json.dumps(
    {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Method Not Allowed: this server is stateless "
                                                                       "and offers no SSE stream; POST requests"}}
)  # fmt: skip


def router(deps: ApiDeps) -> Router:
    routes = Router()
    server: list[Any] = []  # built on the first call: importing mcp costs the other routes nothing

    @routes.route("/mcp", method=["POST", "GET", "DELETE"], include_in_schema=False)
    def mcp() -> Response[str]:
        from agentq.api.mcp_server import McpDeps, build_server, caller_var

        event = routes.current_event
        if event.http_method.upper() == "GET":
            # A GET asks for a standalone SSE stream of server-initiated messages; a stateless
            # server has none to send, and the transport would hold the stream (and the Lambda)
            # open until its timeout: the spec's answer is 405.
            return Response(
                status_code=405, content_type="application/json", body=_NO_STREAM, headers={"Allow": "POST"}
            )
        if not server:
            server.append(build_server(McpDeps(deps.store, deps.tools, deps.queues, deps.defaults, deps.fanout)))
        body = (event.decoded_body or "").encode()
        if event.http_method.upper() == "POST" and (wrong := not_a_message(body)) is not None:
            said = {"jsonrpc": "2.0", "id": request_id(body), "error": {"code": INVALID_REQUEST, "message": wrong}}
            return Response(status_code=400, content_type="application/json", body=json.dumps(said))
        headers = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (event.headers or {}).items()]
        token = caller_var.set(deps.caller())
        try:
            status, out, payload = asyncio.run(_serve(server[0], event.http_method.upper(), headers, body))
        finally:
            caller_var.reset(token)
        content_type = out.pop("content-type", "application/json")
        return Response(status_code=status, content_type=content_type, body=payload.decode(), headers=out)

    return routes


async def _serve(
    server: Any, method: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    """One request through the ``mcp`` package's session manager (stateless, JSON answers)."""
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings

    manager = StreamableHTTPSessionManager(
        app=server,
        json_response=True,
        stateless=True,
        # The API Gateway (or the local server) and the authorizer stand in front: the Host
        # header is the gateway's, which a localhost allowlist would refuse.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    async with manager.run():
        return await serve(manager.handle_request, method=method, path="/mcp", headers=headers, body=body)


def not_a_message(body: bytes) -> str | None:
    """Why ``body`` is no JSON-RPC message MCP takes (JSON-RPC 2.0's Invalid Request), or None:
    a message is one object (MCP dropped batches in 2025-06-18) with ``"jsonrpc": "2.0"`` and a
    string ``method`` (a request, a notification) or an ``id`` with a ``result`` or an ``error``
    (a response); ``params``, when given, an object; an ``id`` a string or an integer. The
    ``mcp`` package answered such JSON -32602 with pydantic's whole report (its type names, help
    URLs, the input echoed back), which the API keeps from its callers everywhere else. A body
    that is not JSON is left to the package (-32700), as are a known method's params."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, list):
        return "Invalid Request: a batch (a JSON array) is not taken: send one JSON-RPC message per request"
    if not isinstance(value, dict):
        return f"Invalid Request: the body is a JSON {type(value).__name__}, not a JSON-RPC message (an object)"
    if value.get("jsonrpc") != "2.0":
        return 'Invalid Request: "jsonrpc" must be "2.0"'
    if "id" in value and (isinstance(value["id"], bool) or not isinstance(value["id"], (str, int))):
        return 'Invalid Request: "id" must be a string or an integer'
    if "method" in value:
        if not isinstance(value["method"], str):
            return 'Invalid Request: "method" must be a string'
        if "params" in value and not isinstance(value["params"], dict):
            return 'Invalid Request: "params" must be an object'
        return None
    if "id" in value and ("result" in value or "error" in value):
        return None
    return 'Invalid Request: a JSON-RPC message has a "method" (a request or a notification) or an "id" with a "result" or an "error" (a response)'


def is_mcp_path(path: str) -> bool:
    return MCP_PATH.fullmatch(path.split("?", 1)[0]) is not None


def in_rpc_words(status: int, answer: bytes | str, request: bytes | str | None) -> bytes | None:
    """``answer``, agentq's error (``{"error": {"code", "message", "field"?}}``, status 400 or
    more) to the JSON-RPC message ``request``, as a JSON-RPC error response: its message as it
    was, agentq's code and field in ``data``, and the request's id when it can be read
    (``request_id``; JSON-RPC's null otherwise). None for any other answer: a success, or the
    ``mcp`` package's own JSON-RPC error (whose code is a number)."""
    if status < 400:
        return None
    try:
        error = json.loads(answer)["error"]
        code, message = error["code"], error["message"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(code, str) or not isinstance(message, str):
        return None
    rpc_code = PARSE_ERROR if code in _UNPARSED else INTERNAL_ERROR if status >= 500 else INVALID_REQUEST
    data = {"code": code, **({"field": error["field"]} if isinstance(error.get("field"), str) else {})}
    said = {"jsonrpc": "2.0", "id": request_id(request), "error": {"code": rpc_code, "message": message, "data": data}}
    return json.dumps(said).encode()


def proxy_in_rpc_words(answer: dict[str, Any], event: Mapping[str, Any]) -> dict[str, Any]:
    """A proxy response (``api.app``'s) to the request ``event``, its error in JSON-RPC's words."""
    if answer.get("isBase64Encoded"):
        return answer
    request = event.get("body")
    if request and event.get("isBase64Encoded"):
        try:
            request = base64.b64decode(request)
        except (binascii.Error, ValueError):
            request = None
    said = in_rpc_words(int(answer.get("statusCode") or 500), answer.get("body") or "", request)
    return answer if said is None else {**answer, "body": said.decode()}


class _Object:
    """A JSON object read by ``request_id``: its members as given (a member named twice stays twice)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def request_id(request: bytes | str | None) -> str | int | None:
    """The id of the one JSON-RPC request (an object with a ``method`` and an ``id``) that
    ``request`` holds, or None: none read (a body over the API's limit is not parsed for it),
    not JSON, a notification, a response, a batch, or an id named twice or not a string or an
    integer (MCP's ids). JSON-RPC answers an error whose request's id could not be read with a
    null id; the ``mcp`` client then gives the error to the request it sent."""
    if not request or len(request) > MAX_BODY_BYTES:
        return None
    try:
        value = json.loads(request, object_pairs_hook=_Object, parse_constant=lambda _: None,
                           parse_int=lambda digits: int(digits) if len(digits) <= 20 else None)  # fmt: skip
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, _Object):
        return None
    ids = [v for k, v in value.pairs if k == "id"]
    if len(ids) != 1 or not any(k == "method" for k, _ in value.pairs):
        return None
    found = ids[0]
    return found if isinstance(found, str) or (isinstance(found, int) and not isinstance(found, bool)) else None
