"""``/mcp``: agentq's MCP server (``api.mcp_server``) on the API's own route, with its auth.

The ``mcp`` package serves streamable HTTP as an ASGI app; here it runs in **stateless JSON
mode** (each POST a whole JSON-RPC exchange answered with ``application/json``, no session, no
SSE stream), so one API Gateway request is one Lambda invocation: the same API Lambda, behind the
same TOKEN authorizer (a tenant's API key), with no connection to keep and no session that
another Lambda instance would not know. The route hands the request to the ASGI app in an event
loop of its own and the ASGI answer back to powertools. Not in the OpenAPI document: it speaks
JSON-RPC, not the REST API's shapes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aws_lambda_powertools.event_handler import Response

from agentq.api.asgi_request import serve
from agentq.api.routes.common import ApiDeps, Router

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
