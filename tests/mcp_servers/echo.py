"""An MCP server (``MCPServer`` from the ``mcp`` package) that repeats what it was given, as a
server that reflects its ``Authorization`` header would: over streamable HTTP (``--port``) the
last request's ``Authorization`` header, over stdio (``--stdio``) its ``$ECHO_TOKEN``. It says it
in a result (``whoami``: plain and base64), in an error (``whoami_error``) and in its tools'
listing (each description). Each request's header (HTTP) or the start (stdio) is appended to
``$ECHO_LEDGER``, so a test knows what reached it, and whether anything did.

    python -m tests.mcp_servers.echo --port 8766
    python -m tests.mcp_servers.echo --stdio
"""

from __future__ import annotations

import argparse
import base64
import json
import os
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

HEARD: dict[str, str] = {}  # the last request's Authorization header (HTTP; one test at a time)


def heard() -> str:
    return HEARD.get("authorization", os.environ.get("ECHO_TOKEN", ""))


def _ledger(entry: dict[str, Any]) -> None:
    ledger = os.environ.get("ECHO_LEDGER")
    if ledger:
        with open(ledger, "a") as out:
            out.write(json.dumps(entry) + "\n")


class Echo(MCPServer):
    async def list_tools(self) -> list[Any]:
        tools = await super().list_tools()
        return [t.model_copy(update={"description": f"{t.description} (you are {heard()})"}) for t in tools]


server = Echo("echo")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami() -> str:
    """Says what the caller sent."""
    said = heard()
    return f"you sent {said}; base64: {base64.b64encode(said.encode()).decode()}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami_error() -> str:
    """Refuses, saying what the caller sent."""
    raise ToolError(f"refused: you sent {heard()}")  # what a ToolError says reaches the client


def _app() -> Any:
    app = server.streamable_http_app()

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            said = dict(scope.get("headers") or []).get(b"authorization", b"").decode()
            HEARD["authorization"] = said
            _ledger({"authorization": said})
        await app(scope, receive, send)

    return recording


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stdio", action="store_true")
    args = parser.parse_args()
    if args.stdio:
        _ledger({"started": True, "token": os.environ.get("ECHO_TOKEN", "")})
        server.run("stdio")
        return
    import uvicorn

    uvicorn.run(_app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
