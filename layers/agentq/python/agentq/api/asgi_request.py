"""One HTTP request through an ASGI application inside a route: the MCP endpoint (the ``mcp``
package's session manager) and the A2A endpoint (the ``a2a-sdk``'s app) are ASGI, while the
API's routes are request/response (a Lambda event, or the local server). ``serve`` hands the
request's body over at once and collects the whole answer, a stream's too: a Lambda answers
once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Handler = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def serve(
    handle: Handler, *, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes, **scope: Any
) -> tuple[int, dict[str, str], bytes]:
    """``handle(scope, receive, send)`` for one request; its status, headers (lower-cased, no
    content-length: the answer is re-framed) and body. ``scope``: extra ASGI scope keys."""
    request = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "https",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 0), "server": ("agentq", 443), **scope,
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

    await handle(request, receive, send)
    out.pop("content-length", None)
    return status, out, b"".join(chunks)
