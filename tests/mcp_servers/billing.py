"""A real MCP server (``MCPServer`` from the ``mcp`` package) for the tests: a read-only
lookup, a side-effecting ``send_invoice`` that appends each call to ``$BILLING_LEDGER`` (held
mid-call, when asked, until the test releases it: a test kills something while it is held,
whatever the machine's load), one that fails. Over streamable HTTP (``--port``; every request must carry
``Authorization: Bearer $BILLING_TOKEN`` when that is set) or stdio (``--stdio``).

    python -m tests.mcp_servers.billing --port 8765
    python -m tests.mcp_servers.billing --stdio
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("billing")
HELD_AT_MOST = 300.0  # seconds


def release_path(ledger: str, customer: str) -> str:
    """The file whose creation ends a held ``send_invoice`` call for ``customer``."""
    return f"{ledger}.release-{customer}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_price(sku: str) -> str:
    """The price of a product, in cents."""
    return f"{sku} costs {len(sku) * 100} cents"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def send_invoice(customer: str, amount_cents: int, held: bool = False) -> str:
    """Send an invoice to a customer (it is recorded; never send one twice)."""
    ledger = os.environ.get("BILLING_LEDGER")
    if ledger:  # the call arrived: tests that kill something mid-call wait for this
        with open(f"{ledger}.started", "a") as out:
            out.write(json.dumps({"customer": customer}) + "\n")
    if held and ledger:  # mid-call until the test releases it (a time limit only for a test gone)
        release, give_up = release_path(ledger, customer), time.monotonic() + HELD_AT_MOST
        while not os.path.exists(release) and time.monotonic() < give_up:
            time.sleep(0.05)
    if ledger:
        with open(ledger, "a") as out:
            out.write(json.dumps({"customer": customer, "amount_cents": amount_cents, "pid": os.getpid()}) + "\n")
    return f"invoice sent to {customer} for {amount_cents} cents"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def broken(reason: str = "boom") -> str:
    """Always fails."""
    raise RuntimeError(f"the billing backend failed: {reason}")


def _auth_app(token: str) -> Any:
    """The streamable HTTP app behind a bearer-token check (the header comes from a secret)."""
    from starlette.responses import JSONResponse

    app = server.streamable_http_app()
    inner = app

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
        await inner(scope, receive, send)

    return guarded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stdio", action="store_true")
    args = parser.parse_args()
    if args.stdio:
        server.run("stdio")
        return
    token = os.environ.get("BILLING_TOKEN")
    if not token:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
        return
    import uvicorn

    uvicorn.run(_auth_app(token), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
