"""An HTTP server that echoes what it was sent (request line and headers, plain and base64), the
way an API that reflects its ``Authorization`` header would; ``/redirect?to=URL`` answers 302 to
URL, and with ``&echo=HOW`` puts the request's ``Authorization`` token in that URL as a login or
OAuth-ish endpoint that reflects a header into its redirect may (``ECHOES``: as it is, every byte
percent-encoded once or twice, base64, hex, cut in two across the path and the query). For the
vault's tests: whatever reaches it is what agentq sent.

``/headers`` answers the request's header fields as JSON the way httpbin's ``/headers`` does: each
value without the whitespace around it (RFC 9110 5.5: a field value excludes it; Go's net/http,
Node and nginx strip it too), read as UTF-8 with ``?utf8`` (a byte that is no UTF-8 becomes
U+FFFD), and honours a ``Range`` header with a ``206`` as a range-capable front end would;
``?status=N`` answers that status (a ``206`` unasked) and ``?coding=C`` names that
``Content-Encoding`` (the body stays plain). ``/hold`` answers once ``release`` is set, and sets
``holding`` when it arrives: a run is mid-way, one tool call in flight.

``?encoding=CODEC`` (``utf-16-le``, ``utf-32-be``, ...) sends the echo in that encoding instead of
UTF-8, after ``pad`` CJK characters (none of whose bytes is NUL in UTF-16, so ``http_fetch`` does
not take the body for binary), with a byte order mark first if ``bom=1``, and names ``charset``
in its ``Content-Type`` (none if not given)."""

from __future__ import annotations

import base64
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _percent(text: str) -> str:
    return "".join(f"%{b:02X}" for b in text.encode())


ECHOES = {  # HOW -> (the URL to go to, the token) -> the Location
    "query": lambda to, token: f"{to}?auth={token}",
    "percent": lambda to, token: f"{to}?auth={_percent(token)}",
    "percent-twice": lambda to, token: f"{to}?auth={urllib.parse.quote(_percent(token))}",
    "base64": lambda to, token: f"{to}?state={base64.urlsafe_b64encode(f'Bearer {token}'.encode()).decode()}",
    "base64-percent": lambda to, token: (
        f"{to}?k={urllib.parse.quote(base64.b64encode(token.encode()).decode(), safe='')}"
    ),
    "hex": lambda to, token: f"{to}?h={token.encode().hex()}",
    "split": lambda to, token: f"{to}/{token[: len(token) // 2]}?{token[len(token) // 2 :]}",
}


class EchoServer:
    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []  # headers of every request received, lower-cased names
        self.holding = threading.Event()  # a /hold request arrived
        self.release = threading.Event()  # the test lets it answer
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append({"path": self.path, **headers})
                parts = urllib.parse.urlsplit(self.path)
                if parts.path == "/redirect":
                    asked = urllib.parse.parse_qs(parts.query)
                    target = asked["to"][0]
                    if "echo" in asked:
                        token = self.headers.get("Authorization", "").split(" ")[-1]
                        target = ECHOES[asked["echo"][0]](target, token)
                    self.send_response(302)
                    self.send_header("Location", target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if parts.path in ("/headers", "/hold"):
                    self._fields(parts.query)
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

            def _fields(self, query: str) -> None:
                asked = dict(urllib.parse.parse_qsl(query))
                if self.path.startswith("/hold"):
                    server.holding.set()
                    server.release.wait(30)
                fields = {k: v.strip(" \t") for k, v in self.headers.items()}
                if "utf8" in asked:
                    fields = {k: v.encode("latin-1").decode("utf-8", "replace") for k, v in fields.items()}
                body, status = json.dumps({"headers": fields}).encode(), int(asked.get("status", 200))
                wanted = self.headers.get("Range", "")
                if wanted.startswith("bytes="):
                    first, _, last = wanted[6:].partition("-")
                    body, status = body[int(first) : int(last) + 1], 206
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if "coding" in asked:
                    self.send_header("Content-Encoding", asked["coding"])
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
