"""What the API's HTTP server checks of a request before it reads the body or calls the handler.

API Gateway does all of this in front of the Lambda functions; the HTTP server
(``api/http_server.py``), where the development stack runs it on localhost, faces the raw
socket, and trusted it: a ``Content-Length`` of ``abc`` dropped the connection, ``-1`` read
until the client closed, a length longer than the body held a thread for good, and ``10^12``
without a key was a ``MemoryError``; a keyless ``agentq dev`` answered any ``Host``, so a web
page (DNS rebinding: a name of the page's that resolves to 127.0.0.1) could drive it. Now, in
this order, each a JSON error (``api.errors.error_body``):

- ``Host`` (keyless server only: with keys, a page has no key to send) must name the server
  itself (a loopback name or its own address, with its port): else 421 ``misdirected_request``;
- ``Transfer-Encoding`` is refused (411 ``length_required``): the body is read by its length;
- ``Content-Length`` must be ASCII digits, the same in every copy: else 400
  ``invalid_content_length``;
- the key is checked (401) and the length against the API's limit (413 ``body_too_large``)
  before a byte of the body is read;
- the body must arrive within ``BODY_SECONDS`` (408 ``request_timeout``), whole (400
  ``incomplete_body`` when the client stops sending).

A refusal before the body is read closes the connection (the unread body would be taken for
the next request). The stdlib's own refusals (414 request line too long, 431 headers too large,
400 malformed request line) are JSON too (``error_page``).
"""

from __future__ import annotations

import io
import json
import re
import socket
import time
from collections.abc import Mapping, Sequence
from http import HTTPStatus

from agentq.api.errors import error_body

BODY_SECONDS = 10.0  # a client has this long to send the body it announced
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
_LENGTH = re.compile(r"[0-9]{1,20}")  # ASCII digits only: int() would take " 12", "+1" or Unicode digits
_HOST = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(?::([0-9]{1,5}))?")

# The stdlib's refusals (BaseHTTPRequestHandler.send_error) by status: the error code a client reads.
STDLIB_CODES = {
    400: "bad_request",
    408: "request_timeout",
    414: "uri_too_long",
    431: "headers_too_large",
    501: "not_implemented",
    505: "http_version_not_supported",
}


class Refused(Exception):
    """A request answered with an error before the handler: ``status``, ``code``, ``message``, ``field``."""

    def __init__(
        self, status: int, code: str, message: str, field: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = dict(headers or {})

    def page(self) -> tuple[int, dict[str, str], bytes]:
        return error_page(self.status, self.code, self.message, self.field, self.headers)


def error_page(
    status: int, code: str, message: str, field: str | None = None, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a JSON error that closes the connection."""
    body = json.dumps(error_body(code, message, field)).encode()
    return status, {"Content-Type": "application/json", **(headers or {}), "Connection": "close"}, body


def check_host(host: str | None, own_host: str, port: int) -> None:
    """Refuse a ``Host`` that does not name this server (a page's own name, rebound to 127.0.0.1)."""
    match = _HOST.fullmatch((host or "").strip())
    names = LOOPBACK_NAMES | {own_host.lower()}
    if match is None or match[1].lower() not in names or (match[2] is not None and int(match[2]) != port):
        raise Refused(
            421,
            "misdirected_request",
            f"Host {host!r} is not this server: the keyless local API answers only requests for "
            f"localhost, 127.0.0.1 or [::1] on port {port}",
            "Host",
        )


def content_length(values: Sequence[str], transfer_encoding: str | None) -> int:
    """The announced body length (0: none), or ``Refused``."""
    if transfer_encoding:
        raise Refused(411, "length_required", "send the body with Content-Length, not Transfer-Encoding",
                      "Transfer-Encoding")  # fmt: skip
    if not values:
        return 0
    if len(set(values)) > 1 or not _LENGTH.fullmatch(values[0]):
        shown = ", ".join(repr(v[:40]) for v in values)
        raise Refused(400, "invalid_content_length", f"Content-Length {shown}: one number of bytes, digits only",
                      "Content-Length")  # fmt: skip
    return int(values[0])


def check_size(length: int, limit: int) -> None:
    if length > limit:
        raise Refused(413, "body_too_large", f"request body of {length} bytes; the limit is {limit}", "body")


def read_body(connection: socket.socket, rfile: io.BufferedIOBase, length: int, seconds: float = BODY_SECONDS) -> bytes:
    """Exactly ``length`` bytes of body, all within ``seconds`` (a deadline for the whole body, so
    a client trickling a byte at a time cannot hold the thread either), or ``Refused``."""
    deadline = time.monotonic() + seconds
    chunks: list[bytes] = []
    got = 0
    try:
        while got < length:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            connection.settimeout(left)
            chunk = rfile.read1(length - got)
            if not chunk:
                raise Refused(400, "incomplete_body", f"the body ended after {got} of the {length} bytes "
                              "Content-Length announced", "Content-Length")  # fmt: skip
            chunks.append(chunk)
            got += len(chunk)
    except TimeoutError:
        raise Refused(408, "request_timeout", f"the body did not arrive within {seconds:g} s: {got} of the "
                      f"{length} bytes Content-Length announced", "body") from None  # fmt: skip
    finally:
        connection.settimeout(None)
    return b"".join(chunks)


def stdlib_error(status: int, message: str | None, explain: str | None) -> tuple[int, dict[str, str], bytes]:
    """The JSON page for one of ``BaseHTTPRequestHandler``'s own refusals (it writes HTML)."""
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "error"
    text = message or phrase
    if explain and explain != text:
        text = f"{text}: {explain}"
    return error_page(status, STDLIB_CODES.get(status, "http_error"), text)
