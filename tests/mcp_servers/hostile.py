"""A hostile MCP server (``MCPServer`` from the ``mcp`` package): tools that answer ``megabytes``
MB of text, read-only (``huge``) and side-effecting (``huge_once``: each call appended to
``$HOSTILE_LEDGER``, so a test counts them), one that echoes the request's headers; a listing
that names ``echo_headers`` twice (``HOSTILE_DUPLICATE=1``) or describes ``huge`` in
``$HOSTILE_LISTING_MB`` MB. Over streamable HTTP, answering with one JSON body (``--json``) or
SSE, gzipped for a client that accepts it (``--gzip``); or over stdio (``--stdio``), where a
reply is one line.

    python -m tests.mcp_servers.hostile --port 8766 [--json] [--gzip]
    python -m tests.mcp_servers.hostile --stdio
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations


class _Hostile(MCPServer):
    """Lists ``echo_headers`` twice under ``HOSTILE_DUPLICATE=1`` (the second claiming side
    effects); describes ``huge`` in ``$HOSTILE_LISTING_MB`` MB when that is set."""

    async def list_tools(self) -> list[Any]:
        tools = await super().list_tools()
        bloat = int(os.environ.get("HOSTILE_LISTING_MB", "0"))
        if bloat:
            tools = [t.model_copy(update={"description": "x" * bloat * 1024 * 1024}) if t.name == "huge" else t
                     for t in tools]  # fmt: skip
        if os.environ.get("HOSTILE_DUPLICATE") == "1":
            [echo] = [t for t in tools if t.name == "echo_headers"]
            twin = echo.model_copy(
                update={
                    "description": "the same name, side-effecting",
                    "annotations": ToolAnnotations(read_only_hint=False),
                }
            )
            tools.append(twin)
        return tools


server = _Hostile("hostile")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def huge(megabytes: int = 1) -> str:
    """Answers ``megabytes`` MB of text."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool(annotations=ToolAnnotations(read_only_hint=False))
def huge_once(megabytes: int = 1) -> str:
    """Answers ``megabytes`` MB of text, and records that it ran (a side effect)."""
    ledger = os.environ.get("HOSTILE_LEDGER")
    if ledger:
        with open(ledger, "a") as out:
            out.write(f"huge_once {megabytes}\n")
    return "x" * (megabytes * 1024 * 1024)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo_headers(ctx: Context) -> str:
    """Echoes the request's headers."""
    request = ctx.request_context.request
    return repr(dict(request.headers)) if request is not None else "(none)"


class _Lifespanned:
    """The gzip-wrapped app, its lifespan events handed to the MCP app (which starts its session manager)."""

    def __init__(self, wrapped: Any, app: Any) -> None:
        self.wrapped, self.app = wrapped, app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await (self.app if scope["type"] == "lifespan" else self.wrapped)(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--gzip", action="store_true", help="compress answers (a client accepting gzip inflates them)")
    parser.add_argument("--stdio", action="store_true")
    args = parser.parse_args()
    if args.stdio:
        server.run("stdio")
        return
    if args.gzip:
        import uvicorn
        from starlette.middleware.gzip import GZipMiddleware

        app = server.streamable_http_app(json_response=args.json)
        wrapped = GZipMiddleware(app, minimum_size=1000)
        uvicorn.run(_Lifespanned(wrapped, app), host="127.0.0.1", port=args.port, log_level="warning")
        return
    server.run("streamable-http", host="127.0.0.1", port=args.port, json_response=args.json)


if __name__ == "__main__":
    main()
