"""An HTTP server that echoes what it was sent (request line and headers, plain and base64), the
way an API that reflects its ``Authorization`` header would; ``/redirect?to=URL`` answers 302 to
URL. For the vault's tests: whatever reaches it is what agentq sent.

``?encoding=CODEC`` (``utf-16-le``, ``utf-32-be``, ...) sends the echo in that encoding instead of
UTF-8, after ``pad`` CJK characters (none of whose bytes is NUL in UTF-16, so ``http_fetch`` does
not take the body for binary), with a byte order mark first if ``bom=1``, and names ``charset``
in its ``Content-Type`` (none if not given)."""

from __future__ import annotations

import base64
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class EchoServer:
    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []  # headers of every request received, lower-cased names
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append({"path": self.path, **headers})
                parts = urllib.parse.urlsplit(self.path)
                if parts.path == "/redirect":
                    target = urllib.parse.parse_qs(parts.query)["to"][0]
                    self.send_response(302)
                    self.send_header("Location", target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                raw = f"{self.requestline}\n{self.headers}".encode()
                body = raw + b"\nbase64: " + base64.b64encode(raw) + b"\n"
                content_type = "text/plain; charset=utf-8"
                query = dict(urllib.parse.parse_qsl(parts.query))
                if "encoding" in query:
                    codec = query["encoding"]
                    text = "\u4e01" * int(query.get("pad", 0)) + body.decode()
                    body = ("\ufeff" if query.get("bom") == "1" else "").encode(codec) + text.encode(codec)
                    content_type = "text/plain" + (f"; charset={query['charset']}" if "charset" in query else "")
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}{path}"


@contextmanager
def echo_server() -> Iterator[EchoServer]:
    server = EchoServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
