"""An HTTP endpoint on loopback that records what it is posted, for the tests of what agentq
delivers to a URL its tenant gave: task callbacks (tests/test_webhooks.py) and A2A push
notifications (tests/test_a2a_push.py). It answers 500 to the first ``fail`` posts and 204
after, so a test sees a failed delivery tried again. ``Stalling`` is a receiver that holds a
post: one that never answers, or answers a byte at a time."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Every post as (headers with lower-case names, body, the status answered)."""

    def __init__(self, fail: int = 0, path: str = "/hooks/agentq") -> None:
        self.fail = fail
        self.path = path
        self.received: list[tuple[dict[str, str], bytes, int]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                status = 500 if len(owner.received) < owner.fail else 204
                owner.received.append(({k.lower(): v for k, v in self.headers.items()}, body, status))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{self.path}"

    def taken(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """The posts answered 204, their bodies as JSON."""
        return [(headers, json.loads(body)) for headers, body, status in self.received if status == 204]


class Stalling:
    """A receiver on loopback that reads each request and then stalls it: it never answers
    (``drip=None``), or drips an answer's status line and headers a few bytes at a time, every
    ``drip`` seconds for ``for_seconds``, so no single read waits long but the whole answer does.
    ``connections``: how many posts reached it."""

    def __init__(self, drip: float | None = None, for_seconds: float = 4.0) -> None:
        self.drip, self.for_seconds = drip, for_seconds
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.connections = 0
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._stall, args=(conn,), daemon=True).start()

    def _stall(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.recv(65536)
            if self.drip is None:
                return  # held open, unanswered, until close()
            conn.sendall(b"HTTP/1.1 204 No Content\r\n")
            until = time.monotonic() + self.for_seconds
            while time.monotonic() < until:
                conn.sendall(b"x-slow: 1\r\n")
                time.sleep(self.drip)
            conn.sendall(b"content-length: 0\r\n\r\n")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    @property
    def allow(self) -> str:
        """Its entry in AGENTQ_WEBHOOK_ALLOW."""
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        for conn in self._open:
            conn.close()
        self.sock.close()
