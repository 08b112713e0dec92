"""An HTTP endpoint on loopback that records what it is posted, for the tests of what agentq
delivers to a URL its tenant gave: task callbacks (tests/test_webhooks.py) and A2A push
notifications (tests/test_a2a_push.py). It answers 500 to the first ``fail`` posts and 204
after, so a test sees a failed delivery tried again."""

from __future__ import annotations

import json
import threading
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
