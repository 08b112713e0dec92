"""The HTTP client of an MCP session (``core.tools.mcp``): it asks for replies unencoded and
refuses one over ``MAX_REPLY_BYTES`` as it is read, before it is held whole.

Why: the ``mcp`` package reads a JSON reply whole and then parses it (a 64 MB reply grew a
worker by ~600 MB, a 300 MB one peaked at 3 GB), bounds only one SSE event, and httpx inflates
a gzipped reply whatever it becomes (64 MB arrived as 130 KB). A tool result keeps 100,000
characters (``core.tools._core.MAX_RESULT_CHARS``), so what lies past the bound would be cut
anyway; one hostile server, or one relaying a hostile page, must not take down the worker and
every task it runs (a read-only call runs again on resume: down again, until the DLQ), nor the
API process that lists a server's tools when an agent version is created.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2

MAX_REPLY_BYTES = 4 * 1024 * 1024
"""One HTTP reply's body at most (a JSON answer, or a stream of events, counted as it arrives):
forty times what a tool result keeps, room for a listing of many tools with their schemas, and
small enough that parsing one costs a worker tens of MB, not hundreds. The ``mcp`` package's
own bound on one SSE event is set to it (``max_sse_event_size``), so both refuse the same size."""


class ReplyRefused(Exception):
    """A reply refused as it was read: over the bound, or encoded though identity was asked."""


class ReplyBound:
    """The bound on one session's replies, and the first reply it refused. The ``mcp`` package
    turns some failures into a JSON-RPC error of its own (an SSE stream's into "ended without a
    response"), so the session reads ``refused`` to say what happened, whatever reached it."""

    def __init__(self, limit: int = MAX_REPLY_BYTES) -> None:
        self.limit = limit
        self.refused: ReplyRefused | None = None

    def refuse(self, why: str) -> ReplyRefused:
        refusal = ReplyRefused(why)
        self.refused = self.refused or refusal
        return refusal

    async def check(self, response: httpx2.Response) -> None:
        """A response hook: runs before a byte of the body is read, whatever transport (or
        proxy from the environment) carried it. A declared length over the bound is refused
        at once; any other body is counted as it arrives."""
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):  # asked for identity: its size is known only once inflated
            raise self.refuse(f"a reply encoded {encoding!r}, which was not asked for")
        length = response.headers.get("content-length", "").strip()
        if length.isascii() and length.isdigit() and int(length) > self.limit:
            raise self.refuse(f"a reply of {int(length)} bytes, over the {self.limit} one reply may hold")
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _Bounded(response.stream, self)


class _Bounded(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, bound: ReplyBound) -> None:
        self.inner, self.bound = inner, bound

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            seen += len(chunk)
            if seen > self.bound.limit:
                raise self.bound.refuse(f"a reply over the {self.bound.limit} bytes one reply may hold")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


def http_client(headers: dict[str, str], bound: ReplyBound) -> httpx2.AsyncClient:
    """The ``mcp`` package's client (its timeouts) with the deployment's ``headers``, asking
    for identity encoding (an ``Accept-Encoding`` among the headers is replaced) and bounded by
    ``bound``."""
    from mcp.shared._httpx_utils import create_mcp_http_client

    sent = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
    client = create_mcp_http_client(headers={**sent, "Accept-Encoding": "identity"})
    client.event_hooks = {"response": [bound.check]}
    return client
