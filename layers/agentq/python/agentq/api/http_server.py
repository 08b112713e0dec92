"""Serve the API's resolver over HTTP: each request becomes an API Gateway REST proxy event, so the
server runs the very handler API Gateway invokes. Two places run it: in AWS, the ``events``
function (``functions/events/server.py``) serves task event streams with it behind the Lambda
Web Adapter (the tenant from API Gateway's authorizer, ``context_tenant``); on a laptop, the
development stack (``agentq_dev.stack``: ``agentq dev``, the tests) serves the whole API on
localhost. It sits with the API, in the Lambda layer, for the first.

Auth works as in AWS: with an ``authorizer`` (``agentq.api.auth.authorize``), every request but the
public ones (``/health``, ``/openapi.json``, the console's pages) must carry ``Authorization: Bearer <key>``; a
refused key is answered 401 before the handler runs, and the key's tenant reaches the handler
in ``requestContext.authorizer.tenant``, where API Gateway puts a Lambda authorizer's context
(with ``operator``: whether the key may read every tenant's usage). Without one, every request
is tenant ``local``, and an operator: the one local user owns the whole deployment. The request's
translation (the proxy event, the authorizer's say, ``dispatch``) is ``api/gateway_proxy.py``.

A request for ``/tasks/{id}/events`` that accepts ``text/event-stream`` is streamed (when the
server has an ``EventHub``): the handler answers it first as a one-event JSON page, so the task
and the cursor are checked (404, 400, 422) exactly as in AWS before any event; then the hub keeps
the connection, sending each event as it commits (``api/event_hub.py``). An A2A call
(``POST /a2a/{agent}``) runs the handler with the connection at hand (``api/live_stream.py``),
so a stream it answers is sent event by event.

Requests are served concurrently, a thread each, through one resolver: powertools keeps the
request being answered in shared state, so ``agentq.api.app.AgentqResolver`` keeps it per
request (a ``ContextVar``); without that, two requests at once answered with each other's route
or body (``tests/test_local_api_isolation.py`` races 200 clients of two tenants).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from collections.abc import Callable
from contextlib import nullcontext
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from pydantic import TypeAdapter

from agentq.api import http_guard
from agentq.api.auth import caller_of
from agentq.api.errors import error_body
from agentq.api.gateway_proxy import (
    _REFUSED_KEY,
    LOCAL_TENANT,
    Authorizer,
    Caller,
    _caller,
    context_tenant,
    dispatch,
    proxy_event,
    refusal,
    wsgi_app,
)
from agentq.api.hang_ups import HangUps
from agentq.api.live_stream import LiveStream, live_var
from agentq.api.models.base import body_limit
from agentq.api.routes.a2a import is_rpc_path, rpc_refusal
from agentq.api.routes.mcp import in_rpc_words, is_mcp_path
from agentq.api.stream_caps import TooManyStreams
from agentq.core.errors import AgentqError, TaskNotFound

if TYPE_CHECKING:
    from agentq.api.event_hub import EventHub

log = logging.getLogger("agentq.local")

# What the server's users import from here (the request's translation lives in api/gateway_proxy.py).
__all__ = ["LOCAL_TENANT", "ApiServer", "Authorizer", "context_tenant", "dispatch", "proxy_event", "wsgi_app"]


class _Server(ThreadingHTTPServer):
    """A thread per connection; the resolver keeps each request's state apart
    (``agentq.api.app.AgentqResolver``)."""

    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: socketserver's 5 reset a burst of clients

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up before its answer is written (a page navigated away, a CLI
        or a test that gave up waiting) is an expected race: one line in the log (INFO), where
        socketserver printed a traceback to stderr. Anything else keeps the traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)):
            log.info("a client (%s) went away before its answer: %s", client_address[0], exc)
            return
        super().handle_error(request, client_address)


_EVENTS_PATH = re.compile(r"/tasks/([^/]+)/events")
_BOOLEAN = TypeAdapter(bool)  # how the handler reads a boolean query (``tree``)
_SEND_PIECE = 64 * 1024  # a stream is sent in pieces: a slow reader need take only one per send timeout
# The events hub is read from the console's origin (the API's) and any other page holding a key.
_CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "Authorization, Last-Event-ID, Accept",
    "Access-Control-Allow-Methods": "GET, OPTIONS",
    "Access-Control-Max-Age": "600",
}


class ApiServer:
    def __init__(
        self,
        handler: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        authorizer: Authorizer | None = None,
        hub: EventHub | None = None,
        body_seconds: float = http_guard.BODY_SECONDS,
        hub_only: bool = False,
        healthy: Callable[[], bool] | None = None,
    ) -> None:
        """``authorizer`` maps an Authorization header value to a tenant (or its authorizer
        context) or raises (401); without one the server answers only requests whose ``Host``
        names it (``api/http_guard.py``).
        ``hub`` streams task events (without one, event streams are answered as in Lambda).
        ``body_seconds``: how long a client has to send the body it announced (408 after).
        ``hub_only``: the events hub (``agentq.hub``): only ``GET /tasks/{id}/events`` and
        ``/health`` (503 while ``healthy`` says no), any origin may read them (CORS: they take a
        bearer key, never a cookie), every other route is 404 ``not_served_here``."""
        self.hub_only = hub_only
        self.healthy = healthy
        self.handler = handler
        self.authorizer = authorizer
        self.host = host
        self.hub = hub
        self.hang_ups = HangUps()  # its streams' clients that hung up, noticed while they wait
        self.body_seconds = body_seconds

        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _reply(self, status: int, headers: dict[str, str], payload: bytes) -> None:
                self.send_response(status)
                for name, value in {**headers, **(_CORS if outer.hub_only else {})}.items():
                    self.send_header(name, str(value))
                if self.command != "HEAD":  # a HEAD's answer has no body, and its GET's length is not known here
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            expects_continue = False

            def handle_expect_100(self) -> bool:
                """``Expect: 100-continue``: answered once the request has passed the checks
                (``_serve``), not before: a refused body is never invited."""
                self.expects_continue = True
                return True

            def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
                """The stdlib's own refusals (414, 431, a malformed request line) as JSON, not HTML;
                in HTTP/1.1 even when the request line was too broken to say (the stdlib then
                answers as HTTP/0.9: a bare body, which no client reads as an answer)."""
                self.log_error("code %d, message %s", code, message)
                if self.request_version in ("", "HTTP/0.9"):
                    self.request_version = "HTTP/1.1"
                self._reply(*http_guard.stdlib_error(code, message, explain))

            def _body(self, headers: dict[str, str]) -> tuple[Caller | None, bytes | None]:
                """The caller and the body, read only once the request may send one (see
                ``api/http_guard.py`` for the order); raises ``http_guard.Refused``."""
                if outer.authorizer is None:
                    http_guard.check_host(self.headers.get("Host"), outer.host, outer.httpd.server_port)
                length = http_guard.content_length(
                    self.headers.get_all("Content-Length") or [], self.headers.get("Transfer-Encoding")
                )
                try:
                    caller: Caller | None = _caller(outer.authorizer, self.path, headers)
                except Exception as exc:  # the key is refused: 401 from dispatch, the body unread
                    if length:
                        status, _, page = refusal(exc)
                        said = json.loads(page)["error"]
                        raise http_guard.Refused(
                            status, "unauthorized", said["message"], said.get("field"), _REFUSED_KEY[4]
                        ) from None
                    return None, None
                http_guard.check_size(length, body_limit(self.path))
                if not length:
                    return caller, None
                if self.expects_continue:
                    self.send_response_only(100)
                    self.end_headers()
                return caller, http_guard.read_body(self.connection, self.rfile, length, outer.body_seconds)

            def _serve(self) -> None:
                headers = dict(self.headers.items())
                if outer.hub_only and self._not_hub():
                    return
                try:
                    caller, body = self._body(headers)
                except http_guard.Refused as refused:
                    if refused.status in (400, 413, 415) and is_rpc_path(urlsplit(self.path).path):
                        answer = rpc_refusal(refused.status, refused.message)  # JSON-RPC's words for an A2A client
                        self._reply(200, {"Content-Type": "application/json", "Connection": "close"},
                                    answer["body"].encode())  # fmt: skip
                        return
                    status, out, page = refused.page()
                    if is_mcp_path(urlsplit(self.path).path):  # and for an MCP client (the body unread: no id)
                        page = in_rpc_words(status, page, None) or page
                    self._reply(status, out, page)
                    return
                parts = urlsplit(self.path)
                match = _EVENTS_PATH.fullmatch(parts.path)
                if (
                    outer.hub is not None
                    and self.command == "GET"
                    and match is not None
                    and "text/event-stream" in (self.headers.get("Accept") or "").lower()
                ):
                    self._stream(outer.hub, unquote(match[1]), headers)
                    return
                if outer.hub is not None and self.command == "POST" and is_rpc_path(parts.path):
                    self._live_rpc(outer.hub, headers, body, caller)
                    return
                self._reply(
                    *dispatch(outer.handler, outer.authorizer, self.command, self.path, headers, body, caller=caller)
                )

            def _live_rpc(
                self, hub: EventHub, headers: dict[str, str], body: bytes | None, caller: Caller | None
            ) -> None:
                """An A2A call with this connection at hand: a stream it answers goes out event by
                event (``api/live_stream.py``), authorised again as an events stream is, anything
                else as the handler's answer."""
                who = caller_of(caller)  # the authorizer's context as the events stream reads it
                allowed = self._allowed(hub, headers, who.key_id if who is not None else None)
                live = LiveStream(hub, self._start_stream, self._send_chunk, allowed)
                token = live_var.set(live)
                try:
                    answer = dispatch(outer.handler, outer.authorizer, "POST", self.path, headers, body, caller=caller)
                finally:
                    live_var.reset(token)
                if not live.started:
                    self._reply(*answer)

            def _start_stream(self, status: int, headers: dict[str, str]) -> None:
                self.send_response(status)
                sent = {k.lower(): v for k, v in headers.items() if k.lower() != "transfer-encoding"}
                sent.setdefault("cache-control", "no-cache")
                sent["connection"] = "close"  # the end of the body is the end of the connection
                for name, value in sent.items():
                    self.send_header(name, value)
                self.end_headers()
                self.close_connection = True
                self.wfile.flush()

            def _send_chunk(self, chunk: bytes) -> None:
                self.wfile.write(chunk)
                self.wfile.flush()

            def _not_hub(self) -> bool:
                """Answer what the events hub does not serve (True: answered)."""
                path = urlsplit(self.path).path
                if self.command == "OPTIONS":  # a browser's preflight of a cross-origin stream
                    self._reply(204, {}, b"")
                    return True
                if self.command in ("GET", "HEAD") and path == "/health":
                    ok = outer.healthy is None or outer.healthy()
                    body = {"status": "ok" if ok else "stale", "role": "events-hub"}
                    self._reply(200 if ok else 503, {"Content-Type": "application/json"}, json.dumps(body).encode())
                    return True
                if self.command == "GET" and _EVENTS_PATH.fullmatch(path):
                    return False
                message = "this server (the events hub) serves only GET /tasks/{id}/events and /health: call the API"
                self._reply(404, {"Content-Type": "application/json"},
                            json.dumps(error_body("not_served_here", message)).encode())  # fmt: skip
                return True

            def _stream(self, hub: EventHub, task_id: str, headers: dict[str, str]) -> None:
                """Check the request as the handler would (one-event JSON page), then stream."""
                query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
                check = {k: v for k, v in headers.items() if k.lower() != "accept"}
                sent = [(k, v) for k, values in query.items() for v in values]  # repeats too: the handler refuses them
                probe = urlsplit(self.path)._replace(
                    query=urlencode(sent if "limit" in query else [("limit", 1), *sent])
                )
                status, out, payload = dispatch(outer.handler, outer.authorizer, "GET", probe.geturl(), check, None)
                if status != 200:
                    self._reply(status, out, payload)
                    return
                caller = caller_of(_caller(outer.authorizer, self.path, headers))
                assert caller is not None  # the check above answered 401 otherwise
                after = query.get("after", [None])[-1] or self.headers.get("Last-Event-ID")
                # read as the handler read it in the check above (pydantic's booleans: yes, on, t, 1, ...);
                # read as true or 1 only, ?tree=yes was checked as a tree and streamed as one task
                tree = _BOOLEAN.validate_python(query.get("tree", ["false"])[-1])
                field = "after" if query.get("after") else "Last-Event-ID"
                try:
                    watch = hub.open(caller, task_id, after, tree=tree, field=field)
                except AgentqError as exc:  # the task or cursor changed since the check: as the handler says
                    code = 404 if isinstance(exc, TaskNotFound) else 400
                    self._reply(code, {"Content-Type": "application/json"},
                                json.dumps(error_body(exc.code, exc.message, exc.field)).encode())  # fmt: skip
                    return
                if hub.finished(watch):
                    self._reply(204, {}, b"")
                    return
                allowed = self._allowed(hub, headers, caller.key_id)
                try:
                    with hub.caps.hold(caller) if hub.caps is not None else nullcontext():
                        self._send_stream(hub, watch, allowed)
                except TooManyStreams as exc:
                    self._reply(429, {"Content-Type": "application/json", "Retry-After": "5"},
                                json.dumps(error_body(exc.code, exc.message)).encode())  # fmt: skip

            def _allowed(self, hub: EventHub, headers: dict[str, str], key_id: str | None) -> Callable[[], bool] | None:
                """How an open stream's caller is authorised again (``EventHub.stream``): the
                authorizer run again on the request's ``Authorization`` (a revoked key, an
                expired token: refused); behind API Gateway (``context_tenant``: the gateway
                authorised the request), the caller's key read again, a token's expiry left to
                the stream's life (840 s there). None without an authorizer (the one local user)."""
                authorizer = outer.authorizer
                if authorizer is None:
                    return None
                if authorizer is context_tenant:
                    return (lambda: hub.key_live(key_id)) if key_id else None

                def allowed() -> bool:
                    try:
                        _caller(authorizer, self.path, headers)
                    except Exception:  # refused, or the check failed: the client comes back through the door
                        return False
                    return True

                return allowed

            def _send_stream(self, hub: EventHub, watch: Any, allowed: Callable[[], bool] | None) -> None:
                self.send_response(200)
                for name, value in {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                    "Connection": "close", **(_CORS if outer.hub_only else {})}.items():  # fmt: skip
                    self.send_header(name, value)
                self.end_headers()
                self.close_connection = True
                # A client that stops reading (a zero receive window) blocked a write for good, and
                # with it this thread and its stream slot: a piece not taken within two keep-alive
                # periods is taken for the client gone, and the slot frees as the stream ends.
                self.connection.settimeout(2 * hub.keepalive)
                wake = threading.Event()  # a hang-up, as a poller's read, wakes the stream
                gone = outer.hang_ups.watch(self.connection, wake)
                try:
                    for chunk in hub.stream(watch, allowed=allowed, wake=wake, gone=gone):
                        data = memoryview(chunk.encode())  # its pieces are views of it, not copies
                        for start in range(0, len(data), _SEND_PIECE):
                            self.wfile.write(data[start : start + _SEND_PIECE])
                        self.wfile.flush()
                        del data, chunk  # not held while the stream waits for the task
                except (BrokenPipeError, ConnectionResetError, TimeoutError):
                    pass  # the client went away: its poller subscription ends with the generator
                finally:
                    outer.hang_ups.forget(self.connection)

            def __getattr__(self, name: str) -> Any:  # every method reaches the handler (405 for the wrong one)
                if name.startswith("do_"):
                    return self._serve
                raise AttributeError(name)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = _Server((host, port), _Handler)
        # A short poll interval: shutdown() waits for the loop's next look at its flag.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="local-api", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.httpd.server_port}"

    def start(self) -> ApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
