"""Serve the API's resolver on localhost: each HTTP request becomes an API Gateway REST proxy
event, so `agentq dev` exercises the very handler API Gateway invokes.

Auth works as in AWS: with an ``authorizer`` (``agentq.api.auth.authorize``), every request but the
public ones (``/health``, ``/openapi.json``, the console's pages) must carry ``Authorization: Bearer <key>``; a
refused key is answered 401 before the handler runs, and the key's tenant reaches the handler
in ``requestContext.authorizer.tenant``, where API Gateway puts a Lambda authorizer's context.
Without one, every request is tenant ``local``.

Requests are served concurrently, a thread each, through one resolver: powertools keeps the
request being answered in shared state, so ``agentq.api.app.AgentqResolver`` keeps it per
request (a ``ContextVar``); without that, two requests at once answered with each other's route
or body (``tests/test_local_api_isolation.py`` races 200 clients of two tenants).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from agentq.api.app import is_public
from agentq.api.errors import error_body

LOCAL_TENANT = "local"


def proxy_event(
    method: str, url: str, headers: dict[str, str], body: str | None, tenant: str | None = LOCAL_TENANT
) -> dict[str, Any]:
    """An API Gateway REST proxy event; ``tenant=None`` carries no authorizer context."""
    parts = urlsplit(url)
    path = unquote(parts.path)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()} or None
    return {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": query,
        "multiValueQueryStringParameters": dict(parse_qs(parts.query, keep_blank_values=True).items()) or None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "requestId": uuid.uuid4().hex,
            "stage": "local",
            "httpMethod": method,
            "path": path,
            "requestTimeEpoch": int(time.time() * 1000),
            "identity": {"sourceIp": "127.0.0.1"},
            "authorizer": {"tenant": tenant} if tenant else None,
        },
        "body": body,
        "isBase64Encoded": False,
    }


Authorizer = Callable[[str | None], str]


def dispatch(
    handler: Any, authorizer: Authorizer | None, method: str, url: str, headers: dict[str, str], body: str | None
) -> tuple[int, dict[str, str], bytes]:
    """One request through the authorizer (if any) and the handler: (status, headers, body)."""
    tenant: str | None = LOCAL_TENANT
    if authorizer is not None and not is_public(unquote(urlsplit(url).path)):
        auth = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
        try:
            tenant = authorizer(auth)
        except Exception:  # the authorizer's refusal, whatever the reason: 401 as API Gateway
            payload = json.dumps(error_body("unauthorized", "missing, unknown or revoked API key")).encode()
            return 401, {"Content-Type": "application/json", "WWW-Authenticate": "Bearer"}, payload
    result = handler(proxy_event(method, url, headers, body, tenant=tenant), None)
    out = {**(result.get("headers") or {})}
    for name, values in (result.get("multiValueHeaders") or {}).items():
        out.setdefault(name, values[-1])
    out.pop("Content-Length", None)
    return int(result.get("statusCode", 500)), out, (result.get("body") or "").encode()


def wsgi_app(handler: Any, authorizer: Authorizer | None = None) -> Callable[..., Any]:
    """The handler as a WSGI application (in-process clients, any WSGI server)."""
    from http import HTTPStatus

    lock = threading.Lock()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length).decode(errors="replace") if length else None
        headers = {k[5:].replace("_", "-").title(): str(v) for k, v in environ.items() if k.startswith("HTTP_")}
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        url = environ.get("PATH_INFO", "/") + (f"?{environ['QUERY_STRING']}" if environ.get("QUERY_STRING") else "")
        with lock:
            status, out, payload = dispatch(handler, authorizer, environ["REQUEST_METHOD"], url, headers, body)
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        start_response(f"{status} {phrase}", [*out.items(), ("Content-Length", str(len(payload)))])
        return [payload]

    return app


class _Server(ThreadingHTTPServer):
    """A thread per connection; the resolver keeps each request's state apart
    (``agentq.api.app.AgentqResolver``)."""

    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: socketserver's 5 reset a burst of clients


class LocalApiServer:
    def __init__(
        self,
        handler: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        authorizer: Authorizer | None = None,
    ) -> None:
        """``authorizer`` maps an Authorization header value to a tenant or raises (401)."""
        self.handler = handler
        self.authorizer = authorizer
        self.host = host

        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _reply(self, status: int, headers: dict[str, str], payload: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, str(value))
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode(errors="replace") if length else None
                headers = dict(self.headers.items())
                self._reply(*dispatch(outer.handler, outer.authorizer, self.command, self.path, headers, body))

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

    def start(self) -> LocalApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
