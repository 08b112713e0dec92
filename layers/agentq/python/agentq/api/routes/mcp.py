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
from collections.abc import MutableMapping
from typing import Any

from aws_lambda_powertools.event_handler import Response

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
            server.append(build_server(McpDeps(deps.store, deps.tools, deps.queues, deps.defaults)))
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
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "https",
        "path": "/mcp", "raw_path": b"/mcp", "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 0), "server": ("agentq", 443),
    }  # fmt: skip
    sent = False
    status, out, chunks = 500, dict[str, str](), list[bytes]()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never disconnects mid-request here
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
            out.update({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])})
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    async with manager.run():
        await manager.handle_request(scope, receive, send)
    out.pop("content-length", None)
    return status, out, b"".join(chunks)
