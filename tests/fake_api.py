"""An HTTP server, in a thread of the test process, that answers as a test scripts it: what an API
that misbehaves (a proxy's web page, another version's JSON, a body cut short, a stream that
drops) looks like on the wire to ``agentq``. Each request is recorded, then handed to the test's
``handle(request, n)`` (``n``: how many came before); ``reply``, ``stream_head``, ``chunk`` and
``sse`` write what it answers. The ``agentq`` fixture runs the command line in this process (the
same ``main()``), and fails the test on an exception out of it: what a person sees as a traceback.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentq.cli.main import main

Request = http.server.BaseHTTPRequestHandler
Handler = Callable[[Request, int], None]


@dataclass
class Fake:
    url: str
    paths: list[str] = field(default_factory=list)


def serve(handle: Handler) -> Iterator[Fake]:
    """A fake API at ``Fake.url`` for the life of the generator (a fixture's ``yield from``)."""
    fake = Fake("")

    class Answer(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            fake.paths.append(self.path)
            handle(self, len(fake.paths) - 1)

        do_GET = do_POST = do_PUT = do_DELETE = _any

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def reply(h: Request, status: int, body: bytes | str, ctype: str = "application/json") -> None:
    data = body.encode() if isinstance(body, str) else body
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def not_found(h: Request) -> None:
    reply(h, 404, json.dumps({"error": {"code": "route_not_found", "message": "no route"}}))


def sse(i: int, status: str = "running", task_id: str = "t1") -> bytes:
    """Event ``e{i}`` of the task's stream, a ``task.status`` of ``status``."""
    data = {"id": f"e{i}", "type": "task.status", "task_id": task_id, "at": 1000.0 + i, "committed": True,
            "data": {"status": status}}  # fmt: skip
    return f"id: e{i}\nevent: task.status\ndata: {json.dumps(data)}\n\n".encode()


END = b"event: end\ndata: {}\n\n"


def stream_head(h: Request) -> None:
    """A 200 event stream sent in chunks, as a Lambda function URL streams (the events hub)."""
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()


def chunk(h: Request, data: bytes) -> None:
    h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    h.wfile.flush()


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def agentq(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """``agentq ARGS`` in this process against URL, with no waits between retries."""

    def run(url: str, *args: str) -> Ran:
        for key in ("AGENTQ_API_KEY", "AGENTQ_PROFILE", "AGENTQ_PROFILES", "XDG_CONFIG_HOME"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("AGENTQ_URL", url)
        monkeypatch.setenv("AGENTQ_POLL_SECONDS", "0.01")
        monkeypatch.setattr("agentq.api.client.time.sleep", lambda s: None)  # the stream's reconnect backoff
        monkeypatch.setattr("agentq.api.http_client.time.sleep", lambda s: None)  # a GET's retry backoff
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
        except Exception as exc:
            pytest.fail(f"agentq {' '.join(args)}: a traceback ({type(exc).__name__}: {exc})")
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run
