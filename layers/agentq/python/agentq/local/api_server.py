"""Serve the API's resolver on localhost: each HTTP request becomes an API Gateway REST proxy
event, so `agentq dev` exercises the very handler API Gateway invokes."""

from __future__ import annotations

import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


def proxy_event(method: str, url: str, headers: dict[str, str], body: str | None, tenant: str = "local") -> dict[str, Any]:
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()} or None
    return {
        "resource": parts.path,
        "path": parts.path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": query,
        "multiValueQueryStringParameters": {k: v for k, v in parse_qs(parts.query).items()} or None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "requestId": uuid.uuid4().hex,
            "stage": "local",
            "httpMethod": method,
            "path": parts.path,
            "requestTimeEpoch": int(time.time() * 1000),
            "identity": {"sourceIp": "127.0.0.1"},
            "authorizer": {"tenant": tenant},
        },
        "body": body,
        "isBase64Encoded": False,
    }


class LocalApiServer:
    def __init__(self, handler: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.handler = handler

        outer = self

        class _Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else None
                event = proxy_event(self.command, self.path, {k: v for k, v in self.headers.items()}, body)
                result = outer.handler(event, None)
                payload = (result.get("body") or "").encode()
                self.send_response(int(result.get("statusCode", 500)))
                headers = {**(result.get("headers") or {})}
                for name, values in (result.get("multiValueHeaders") or {}).items():
                    headers.setdefault(name, values[-1])
                headers.pop("Content-Length", None)
                for name, value in headers.items():
                    self.send_header(name, str(value))
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="local-api", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "LocalApiServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
