"""What a request to the egress proxy (``core.tools.egress``) is, and which it refuses with a
``400`` before it contacts anything: the request line (a method that is a token, a target, a
version), its destination (``CONNECT host:port``, or an absolute ``http://`` URL), and a plain
request's header lines, each ``name: value`` with no control character a server behind might end
a line at."""

from __future__ import annotations

import re
import urllib.parse

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
