"""What a request to the egress proxy (``core.tools.egress``) is, how its head is read (at most
``MAX_HEAD`` bytes, within one deadline: ``read_head``), and which it refuses with a
``400`` before it contacts anything: the request line (a method that is a token, a target, a
version), its destination (``CONNECT host:port``, or an absolute ``http://`` URL), and a plain
request's header lines, each ``name: value`` with no control character a server behind might end
a line at."""

from __future__ import annotations

import re
import socket
import time
import urllib.parse

MAX_HEAD = 16 * 1024
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's token (fullmatch: no "$" before a "\n")
_METHOD = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a token too
VERSION = re.compile(r"HTTP/1\.[01]")
# Bytes no request line or header line may hold: a bare CR or LF (a server that ends a line at
# either would read what follows as another line: a second ``Host``), NUL and every other control
# character; a header value may hold HTAB (``header_fields`` allows it there).
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")
_VALUE_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class BadRequest(ValueError):
    """Not a proxy request this proxy takes: a ``400``."""


class HeadTimeout(Exception):
    """The request head did not arrive in time: a ``408``."""


def read_head(conn: socket.socket, seconds: float) -> tuple[bytes | None, bytes]:
    """A request's head and what followed it, within one deadline for the whole head (a client that
    sends a byte at a time gains nothing by it)."""
    at = time.monotonic() + seconds
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        left = at - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            conn.settimeout(left)
            chunk = conn.recv(4096)
        except TimeoutError:
            raise HeadTimeout(f"no complete request head within {seconds:g} s") from None
        if not chunk:
            return None, b""
        buffer += chunk
        if len(buffer) > MAX_HEAD:
            raise BadRequest("the request head is over 16 KB")
    conn.settimeout(None)
    head, _, rest = buffer.partition(b"\r\n\r\n")
    return head, rest


def header_fields(headers: bytes) -> list[bytes]:
    """A plain request's header lines, each checked to be ``name: value`` with ``name`` a token:
    a line folded onto the one before (leading whitespace), a name with a space before its colon
    (``Host :``), a pseudo-header (``:authority``) or a control character but HTAB in a value (a
    bare LF: ``Accept: x\\nHost: evil``) is a ``400``, not a line passed on that a server behind
    might read as a header the proxy had dropped."""
    lines = [h for h in headers.split(b"\r\n") if h]
    for h in lines:
        name, colon, value = h.partition(b":")
        if not _FIELD_NAME.fullmatch(name) or not colon:
            raise BadRequest(f"a header line that is not 'name: value': {h[:100]!r}")
        if _VALUE_CONTROL.search(value):
            raise BadRequest(f"a control character (a bare CR or LF, NUL, ...) in a header line: {h[:100]!r}")
    return lines


def request_line(line: bytes) -> tuple[str, str, str]:
    """method, target and version of ``METHOD SP target SP version``: a control character
    anywhere (a bare CR or LF would end the line early for a server behind, and what follows
    would be another header, a ``Host``), a method that is not a token or a fourth part is a
    ``400``; the target and the version are checked by the caller."""
    if _CONTROL.search(line):
        raise BadRequest(f"a control character (a bare CR or LF, NUL, ...) in the request line: {line[:100]!r}")
    parts = line.decode("latin-1").split(" ")
    if len(parts) > 3:
        raise BadRequest(f"a request line that is not 'METHOD URL HTTP/1.x': {line[:100]!r}")
    method, target, version = [*parts, "", ""][:3]
    if len(parts) > 1 and not _METHOD.fullmatch(method):
        raise BadRequest(f"a method that is not a token: {method[:100]!r}")
    return method, target, version


def destination(method: str, target: str) -> tuple[str, int, str]:
    """host, port and the origin-form path of a proxy request."""
    if method.upper() == "CONNECT":
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise BadRequest(f"CONNECT to {target!r}: expected host:port")
        return host.strip("[]").lower(), int(port), ""
    parts = urllib.parse.urlsplit(target)
    try:
        number = parts.port or 80
    except ValueError:
        raise BadRequest(f"a bad port in {target[:200]!r}") from None
    if parts.scheme != "http" or not parts.hostname:
        raise BadRequest(f"a proxy request needs an absolute http:// URL or CONNECT, not {target[:200]!r}")
    origin = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname.lower(), number, origin


MAX_CHUNK_LINE = 4096  # a chunk's size line, extensions and all
MAX_TRAILER = 16 * 1024  # a chunked body's trailer section (read to find the body's end, never sent)
_LENGTH = re.compile(rb"[0-9]{1,18}")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:[ \t]*;[^\x00-\x08\x0a-\x1f\x7f]*)?")


class BadBody(BadRequest):
    """A chunked body whose framing is broken: nothing more of it is sent, and the connection ends
    (with a ``400`` unless the upstream has ``answered`` already)."""

    answered = False


def framing(lines: list[bytes], version: str) -> tuple[list[bytes], Body]:
    """A plain request's header lines with its framing headers replaced by the one the proxy
    frames its body by, and that body's reader. ``Content-Length`` (every line of it the same
    digits) or ``Transfer-Encoding: chunked`` (one line, HTTP/1.1, no ``Content-Length``); neither:
    no body (RFC 9112 6.3). Anything else is a ``400``: two framings a server behind might choose
    between differently would let the rest of the body be read as another request."""
    named = [(h.partition(b":")[0].lower(), h.partition(b":")[2].strip(b" \t")) for h in lines]
    lengths = {value for name, value in named if name == b"content-length"}
    codings = [value for name, value in named if name == b"transfer-encoding"]
    kept = [
        h for h, (name, _) in zip(lines, named, strict=True) if name not in (b"content-length", b"transfer-encoding")
    ]
    if codings:
        if lengths:
            raise BadRequest("both Content-Length and Transfer-Encoding: the body's end would be ambiguous")
        if len(codings) > 1 or codings[0].lower() != b"chunked" or version != "HTTP/1.1":
            raise BadRequest(f"a Transfer-Encoding other than one 'chunked' in HTTP/1.1: {codings[0][:100]!r}")
        return [*kept, b"Transfer-Encoding: chunked"], Body(None)
    if not lengths:
        return kept, Body(0)
    if len(lengths) > 1 or not _LENGTH.fullmatch(next(iter(lengths))):
        raise BadRequest(f"a Content-Length that is not one number: {sorted(lengths)[0][:100]!r}")
    length = int(next(iter(lengths)))
    return [*kept, b"Content-Length: %d" % length], Body(length)


class Body:
    """What of the client's bytes after a plain request's head go upstream: exactly the body its
    head frames (a chunked one re-framed as the proxy read it: chunk extensions and trailer fields
    dropped), then nothing: ``feed`` returns what to send, and counts in ``dropped`` every byte
    after the body's end. A broken chunk framing raises ``BadBody``. Not ``framed``: a chunked
    body's data alone (the upstream's answer to a credentialed request, which the proxy sends on
    with a length of its own: ``core.tools.egress_answer``)."""

    def __init__(self, length: int | None) -> None:
        self.chunked = length is None
        self.framed = True  # a chunked body's framing is in what ``feed`` returns
        self.left = length or 0  # bytes of the body (or of the current chunk) still to pass
        self.state = "size" if self.chunked else ("data" if self.left else "done")
        self.line = b""  # a chunked body's line being read
        self.trailer = 0  # bytes of its trailer section read
        self.dropped = 0

    @property
    def done(self) -> bool:
        return self.state == "done"

    def feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        at = 0
        while at < len(data) and self.state != "done":
            if self.state == "data":
                take = min(self.left, len(data) - at)
                out.append(data[at : at + take])
                at += take
                self.left -= take
                if not self.left:
                    self.state = "data end" if self.chunked else "done"
                continue
            line, at = self._line(data, at)
            if line is not None:
                framing = self._chunk_line(line)
                out.append(framing if self.framed else b"")
        self.dropped += len(data) - at
        return b"".join(out)

    def _line(self, data: bytes, at: int) -> tuple[bytes | None, int]:
        """A whole line of the chunked framing (without its CRLF) once its LF has come."""
        end = data.find(b"\n", at)
        self.line += data[at : len(data) if end < 0 else end + 1]
        if len(self.line) > MAX_CHUNK_LINE:
            raise BadBody(f"a line of the chunked body over {MAX_CHUNK_LINE} bytes")
        if end < 0:
            return None, len(data)
        line, self.line = self.line, b""
        if not line.endswith(b"\r\n") or b"\r" in line[:-2]:
            raise BadBody(f"a line of the chunked body that does not end in CRLF: {line[:100]!r}")
        return line[:-2], end + 1

    def _chunk_line(self, line: bytes) -> bytes:
        if self.state == "data end":
            if line:
                raise BadBody(f"a chunk longer than its size: {line[:100]!r}")
            self.state = "size"
            return b"\r\n"
        if self.state == "trailer":
            self.trailer += len(line) + 2
            if self.trailer > MAX_TRAILER:
                raise BadBody(f"a chunked body's trailer over {MAX_TRAILER // 1024} KB")
            if line:
                return b""  # a trailer field: never sent
            self.state = "done"
            return b"0\r\n\r\n"
        size = _CHUNK_SIZE.fullmatch(line)
        if size is None:
            raise BadBody(f"a chunk size line that is not 'hex[;extension]': {line[:100]!r}")
        self.left = int(size[1], 16)
        self.state = "data" if self.left else "trailer"
        return b"%x\r\n" % self.left if self.left else b""
