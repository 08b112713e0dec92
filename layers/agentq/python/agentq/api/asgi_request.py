"""One HTTP request through an ASGI application inside a route: the MCP endpoint (the ``mcp``
package's session manager) and the A2A endpoint (the ``a2a-sdk``'s app) are ASGI, while the
API's routes are request/response (a Lambda event, or the local server). ``serve`` hands the
request's body over at once and collects the whole answer, a stream's too: a Lambda answers
once. Given a ``LiveStream`` (``api/live_stream.py``: the server holds the connection), an answer
of server-sent events goes to it as the app sends it, each event when it happens."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentq.api.live_stream import LiveStream

Handler = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def serve(
    handle: Handler,
    *,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    live: LiveStream | None = None,
    extra: dict[str, str] | None = None,
    **scope: Any,
) -> tuple[int, dict[str, str], bytes]:
    """``handle(scope, receive, send)`` for one request; its status, headers (lower-cased, no
    content-length: the answer is re-framed, ``extra`` added) and body. ``scope``: extra ASGI scope
    keys. With ``live``, an event stream is written there as it comes (``live.started``), and
    the body returned is empty."""
    request = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "https",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 0), "server": ("agentq", 443), **scope,
    }  # fmt: skip
    sent = False
    status, out, chunks = 500, dict[str, str](), list[bytes]()
    streaming = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never disconnects mid-request here
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status, streaming
        if message["type"] == "http.response.start":
            status = int(message["status"])
            out.update({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])})
            out.pop("content-length", None)
            out.update(extra or {})
            if live is not None and out.get("content-type", "").startswith("text/event-stream"):
                streaming = True
                live.begin(status, out)
        elif message["type"] == "http.response.body":
            if streaming and live is not None:
                live.write(bytes(message.get("body", b"")))
            else:
                chunks.append(bytes(message.get("body", b"")))

    await handle(request, receive, send)
    return status, out, b"".join(chunks)
