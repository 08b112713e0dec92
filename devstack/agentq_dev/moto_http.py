"""HTTP/1.1 keep-alive for the local stack's moto server: a connection, and the server thread
serving it, lives as long as its client keeps it, not for one request.

Why: werkzeug's development server (what moto's server runs on) answers every request with
``Connection: close``, so each boto3 call of each local-stack client opens a new TCP connection
and the server accepts it and starts a thread for it: together with Flask's dispatch ~46 % of
the server's CPU per DynamoDB call, plus a connect per call in every worker (measured with
``bench/moto_throughput.py``). boto3 keeps a pool of connections and reuses them when the
server lets it.

Invariant: the next request on a connection starts where the last one's body ended. A
request's body is read in full (its ``Content-Length``) before the application sees it, so
what the application reads of it does not matter; a request whose length is not known up
front (``Transfer-Encoding: chunked``, a malformed length) and any request that failed get
their connection closed after the response, as werkzeug closes every connection. werkzeug's
drain of the socket after each response (which would eat the next request) is therefore not
run. The response itself is the application's, byte for byte, with a ``Content-Length`` added
when the application gave none (werkzeug sent those chunked).

Request headers are parsed without the email package's feed parser (``parse_headers``): for a
block of plain ``Name: value`` lines it builds the same message (6 % of the server's CPU per
call went to the generic parser); anything else (a folded line, a line that is not a header)
still goes through it.
"""

from __future__ import annotations

import email.parser
import http.client
import io
import logging
import re
import select
import socket
import threading
import traceback
from collections.abc import Callable
from typing import Any

from werkzeug.exceptions import InternalServerError
from werkzeug.serving import WSGIRequestHandler

# What a client going away looks like while the server reads or writes (werkzeug's own list).
CONNECTION_DROPPED = (ConnectionError, socket.timeout)
_request_log = logging.getLogger("werkzeug")
# A header line as the email package's feed parser takes it (its headerRE), name then value.
_HEADER_LINE = re.compile(r"([\041-\071\073-\176]+):(.*)", re.DOTALL)
# The connection whose request this thread is answering (see ``client_gone``).
_answering = threading.local()


def client_gone() -> bool:
    """Whether the client of the request this thread answers has closed its connection: it
    ended, or was killed, while the request was being answered (its end reads as end of file, or
    was reset). False off a request's thread, and while the client is there.

    Why: a long poll (moto_sqs) waits up to 20 s for a message on a thread of its own; once its
    client is gone, a message it took would be received by no one and stay invisible for its
    visibility timeout, on its way to the dead-letter queue."""
    connection: socket.socket | None = getattr(_answering, "connection", None)
    if connection is None:
        return False
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        if not readable:  # nothing to read: the client waits for its answer
            return False
        return connection.recv(1, socket.MSG_PEEK) == b""  # end of file; bytes: a next request
    except (BlockingIOError, InterruptedError, TimeoutError):
        return False
    except OSError:  # reset
        return True


def keep_alive_handler(base: type[WSGIRequestHandler]) -> type[WSGIRequestHandler]:
    """``base`` (moto's request handler, which keeps its header handling) with keep-alive."""

    class KeepAliveRequestHandler(base):  # type: ignore[valid-type,misc]
        protocol_version = "HTTP/1.1"
        # A response is written as headers, then body: without TCP_NODELAY the body could
        # wait for the client's delayed ACK of the headers (40 ms) on a reused connection.
        disable_nagle_algorithm = True

        def run_wsgi(self) -> None:
            # The "100 Continue" of an ``Expect`` header was sent by http.server's parse_request.
            self.environ = environ = self.make_environ()
            if not _read_body(self.rfile, environ):
                self.close_connection = True
            response: list[Any] = []
            body: list[bytes] = []

            def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
                response[:] = [status, headers]
                return body.append

            _answering.connection = self.connection
            try:
                result = self.server.app(environ, start_response)
                try:
                    body.extend(result)
                finally:
                    if (close := getattr(result, "close", None)) is not None:
                        close()
            except CONNECTION_DROPPED:
                self.close_connection = True
                return
            except Exception:
                if self.server.passthrough_errors:
                    raise
                self.server.log("error", f"Error on request:\n{traceback.format_exc()}")
                body.clear()
                body.extend(InternalServerError()(environ, start_response))
                self.close_connection = True
            finally:
                _answering.connection = None
            self._respond(response[0], response[1], b"".join(body))

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            # werkzeug formats the line (the path, the date, colours) before its logger drops
            # it: 5 % of the server's CPU per call with the request log off (moto_speed).
            if _request_log.level == logging.NOTSET or _request_log.isEnabledFor(logging.INFO):
                super().log_request(code, size)

        def _respond(self, status: str, headers: list[tuple[str, str]], payload: bytes) -> None:
            code, _, reason = status.partition(" ")
            self.send_response(int(code), reason)
            names = set()
            for name, value in headers:
                self.send_header(name, value)
                names.add(name.lower())
            head = self.command == "HEAD"
            if "content-length" not in names and not head and int(code) >= 200 and int(code) not in (204, 304):
                self.send_header("Content-Length", str(len(payload)))
            if self.close_connection and "connection" not in names:
                self.send_header("Connection", "close")
            self.end_headers()
            if payload and not head:
                self.wfile.write(payload)

    KeepAliveRequestHandler.__qualname__ = KeepAliveRequestHandler.__name__ = f"KeepAlive{base.__name__}"
    return KeepAliveRequestHandler


def _read_body(rfile: Any, environ: dict[str, Any]) -> bool:
    """Replace ``wsgi.input`` by the request's whole body; False when the connection cannot be
    reused after this request (the body's end is not known, or the client sent less)."""
    if environ.get("wsgi.input_terminated"):  # chunked: werkzeug's DechunkedInput reads it
        return False
    declared = environ.get("CONTENT_LENGTH") or "0"
    try:
        length = int(declared)
    except ValueError:
        return False
    if length < 0:
        return False
    data = rfile.read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(data)
    return len(data) == length


def install() -> None:
    """Read request headers with ``parse_headers`` below in this process (http.server looks
    the function up in ``http.client`` for each request)."""
    http.client.parse_headers = parse_headers  # type: ignore[assignment]  # same signature, no overloads


def parse_headers(fp: Any, _class: type[http.client.HTTPMessage] = http.client.HTTPMessage) -> Any:
    """``http.client.parse_headers`` (what ``http.server`` reads a request's headers with), the
    same message built directly when every line is a plain header (the email package's compat32
    policy stores each as its name and its value with leading blanks and the line end dropped)."""
    lines = http.client._read_headers(fp)  # type: ignore[attr-defined]  # limits and errors as before
    message = _class()
    for raw in lines:
        line = raw.decode("iso-8859-1")
        if line in ("\r\n", "\n", ""):
            break
        match = _HEADER_LINE.fullmatch(line)
        if (
            match is None
            or line.startswith("From ")
            or "\r" in (value := match.group(2).rstrip("\r\n"))
            or "\n" in value
        ):
            return email.parser.Parser(_class=_class).parsestr(b"".join(lines).decode("iso-8859-1"))
        message[match.group(1)] = value.lstrip(" \t")
    message.set_payload("")
    return message
