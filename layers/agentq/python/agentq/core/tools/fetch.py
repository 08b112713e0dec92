"""HTTP GET for the model, guarded against server-side request forgery.

A URL is written by the model, and the model may be steered by whatever page it read last.
Unguarded, "fetch this URL" reaches everything the worker can: loopback services, the local
AWS endpoint, the VPC, the instance metadata and the ECS credentials endpoints. So:

- the host is resolved once, here, and *every* address it resolves to must be a public one
  (``core.tools.addresses.refusal`` says what is not: loopback, private, link-local, shared/CGNAT, multicast,
  unspecified, reserved, unique-local and site-local IPv6, IPv4-mapped, -compatible and
  -embedding IPv6 forms, and the cloud metadata and credential addresses by name). Odd
  spellings (``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``) need no rules of
  their own: the resolver turns them into the address that is checked;
- the connection goes to the checked address, never to the name again, so a DNS answer
  that changes between check and use (rebinding) changes nothing; https keeps the name for
  SNI and certificate checks, and the Host header carries it;
- redirects are followed here, at most ``max_redirects``, each hop checked like the first; one
  whose URL holds a credential or secret this run holds, in any spelling the redactor knows, is
  refused before the host it names is resolved (``spells_a_value``): a bound host that reflects
  a request's ``Authorization`` into its ``Location`` would otherwise send the value, in a
  request line, to a host it is not bound to;
- one deadline covers the whole fetch (resolution, every hop, the body): a watchdog shuts
  the socket down when it passes, however slowly the server drips bytes;
- no proxy from the environment is used: a proxy would make the address check moot.

A deployment may also name the only hosts it fetches from (``FetchPolicy.allow``). A name
there is still checked; an IP literal there (``10.0.0.7`` or ``127.0.0.1:8080``) is the one
way to let an internal address through, because the operator wrote that exact address.

The body comes back redacted (``observe.redaction``) and only then cut to ``max_bytes``, which the
model chooses: cut first, an echoed credential straddling the cut would leave all but its end,
which no spelling matches (``redacted_cut``). ``max_bytes`` counts bytes, and the body may be
UTF-16 or UTF-32 (its charset, a byte order mark, or a tool's decoding may say so), where a
character is two to four of them: it is redacted in those encodings too, and read far enough past
the cut for a value's spelling in the widest of them.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentq.core.tools.addresses import METADATA_ADDRESSES, IPAddress, refusal
from agentq.core.vault import MAX_VALUE_BYTES
from agentq.observe.redaction import current, redact_encoded
from agentq.observe.redaction_bytes import WIDEST

ALLOW_VARIABLE = "AGENTQ_HTTP_FETCH_ALLOW"
USER_AGENT = "agentq-http-fetch/0.2"
MAX_REDIRECTS = 5
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
CHUNK = 64 * 1024
# The longest text that carries a credential: a secret form is a value (4,096 bytes at most) or
# a username (256 characters) joined to it; its longest spellings, every symbol as JSON's \u
# escape or an HTML entity (&quot;, &#x27;), are six times its bytes in UTF-8, and at most WIDEST
# times that in UTF-16 or UTF-32 (tests/test_redaction_cuts.py holds the redactor to this).
LONGEST_SPELLING = 8 * MAX_VALUE_BYTES
LONGEST_READ = WIDEST * LONGEST_SPELLING  # its bytes, in whatever encoding the body is
READ_PAST = LONGEST_READ  # read this far past max_bytes, so the cut is made redacted

_HOST_RULE = re.compile(
    r"\[(?P<v6>[0-9a-f:.]+)\](?::(?P<port6>[0-9]{1,5}))?"
    r"|(?P<bare6>[0-9a-f]*:[0-9a-f]*:[0-9a-f:.]*)"
    r"|(?P<name>[a-z0-9_.-]+)(?::(?P<port>[0-9]{1,5}))?"
)


class FetchRefused(ValueError):
    """The URL or an address it leads to is not one http_fetch will contact."""


@dataclass(frozen=True)
class HostRule:
    host: str  # lower-case name, or an IP literal in ipaddress's spelling
    port: int | None = None  # None: any port

    @property
    def literal(self) -> IPAddress | None:
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    @classmethod
    def parse(cls, text: str) -> HostRule:
        """``name``, ``name:port``, ``1.2.3.4[:port]``, ``::1`` or ``[::1]:port``."""
        text = text.strip().lower()
        match = _HOST_RULE.fullmatch(text)
        if match is None:
            raise ValueError(f"{text!r} is not a host name, address, or host:port")
        host = match["v6"] or match["bare6"] or match["name"]
        port = int(match["port6"] or match["port"] or 0) or None
        try:
            host = str(ipaddress.ip_address(host))
        except ValueError:
            if match["name"] is None:
                raise ValueError(f"{text!r} is not a valid IP address") from None
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"{text!r}: the port must be 1..65535")
        return cls(host, port)

    def matches(self, host: str, port: int) -> bool:
        return self.host == host and (self.port is None or self.port == port)


@dataclass(frozen=True)
class FetchPolicy:
    """What one deployment lets http_fetch contact. ``allow`` empty: any public address."""

    allow: tuple[HostRule, ...] = ()
    max_redirects: int = MAX_REDIRECTS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FetchPolicy:
        """``AGENTQ_HTTP_FETCH_ALLOW``: comma-separated hosts, ``host:port``s or IP literals."""
        raw = (os.environ if env is None else env).get(ALLOW_VARIABLE, "")
        rules = []
        for part in raw.split(","):
            if part.strip():
                try:
                    rules.append(HostRule.parse(part))
                except ValueError as exc:
                    raise ValueError(f"{ALLOW_VARIABLE}: {exc}") from None
        return cls(allow=tuple(rules))

    def rule_for(self, host: str, port: int) -> HostRule | None:
        return next((r for r in self.allow if r.matches(host, port)), None)


@dataclass(frozen=True)
class Target:
    url: str
    scheme: str
    host: str  # as sent in Host and SNI (IDNA-encoded, lower case, no brackets)
    port: int
    path: str  # path and query, percent-encoded


def parse_target(url: str) -> Target:
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise FetchRefused(f"not a valid URL: {url!r} ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise FetchRefused(
            f"http_fetch only fetches http:// and https:// URLs, not {scheme or 'scheme-less'} ones: {url!r}"
        )
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise FetchRefused(f"URL has no host: {url!r}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            host = host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise FetchRefused(f"the host of {url!r} is not a valid domain name") from None
    path = urllib.parse.quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
    if parts.query:
        path += "?" + urllib.parse.quote(parts.query, safe="/%:@!$&'()*+,;=-._~?")
    return Target(url=url, scheme=scheme, host=host, port=port or (443 if scheme == "https" else 80), path=path)


class Deadline:
    """One clock for the whole fetch. When it runs out, the current socket is shut down, so a
    read blocked on a server that sends a byte a second returns at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._timer = threading.Timer(max(0.0, seconds), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def remaining(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise self.error()
        return left

    def error(self) -> TimeoutError:
        return TimeoutError(f"the fetch did not finish within its {self.seconds:.1f}s deadline")

    def watch(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            if self.expired and sock is not None:
                _shutdown(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            if self._sock is not None:
                _shutdown(self._sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def resolve(target: Target, policy: FetchPolicy, deadline: Deadline) -> list[IPAddress]:
    """The addresses to connect to, each one checked; refuses if any answer is internal."""
    rule = policy.rule_for(target.host, target.port)
    if policy.allow and rule is None:
        allowed = ", ".join(r.host + (f":{r.port}" if r.port else "") for r in policy.allow)
        raise FetchRefused(
            f"{target.host}:{target.port} is not among the hosts this deployment fetches from ({allowed})"
        )
    if rule is not None and rule.literal is not None:
        if rule.literal in METADATA_ADDRESSES:  # an instance's or a task's role credentials: never, even named
            raise FetchRefused(f"{target.host} is a cloud metadata or credentials endpoint; it is never contacted")
        return [rule.literal]  # the operator named this exact address
    addresses = _getaddrinfo(target, deadline)
    if not addresses:
        raise FetchRefused(f"{target.host} did not resolve to any address")
    for address in addresses:
        why = refusal(address)
        if why is not None:
            shown = target.host if str(address) == target.host else f"{target.host} resolves to {address}, which"
            raise FetchRefused(f"{shown} is {why}; http_fetch only contacts public internet addresses")
    return addresses


def _getaddrinfo(target: Target, deadline: Deadline) -> list[IPAddress]:
    """getaddrinfo has no timeout of its own: it runs in a thread the deadline can abandon."""
    box: dict[str, Any] = {}

    def lookup() -> None:
        try:
            box["infos"] = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            box["error"] = exc

    worker = threading.Thread(target=lookup, name="agentq-http-fetch-dns", daemon=True)
    worker.start()
    worker.join(deadline.remaining())
    if worker.is_alive():
        raise deadline.error()
    if "error" in box:
        raise ConnectionError(f"could not resolve {target.host}: {box['error']}")
    out: list[IPAddress] = []
    for family, _, _, _, sockaddr in box["infos"]:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in out:
            out.append(address)
    return out


@dataclass
class Response:
    status: int
    content_type: str
    charset: str
    body: bytes
    truncated: bool
    url: str
    redirects: list[str] = field(default_factory=list)


def _connection(target: Target, address: IPAddress, timeout: float) -> http.client.HTTPConnection:
    conn: http.client.HTTPConnection
    if target.scheme == "https":
        conn = http.client.HTTPSConnection(
            target.host, target.port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(target.host, target.port, timeout=timeout)

    def pinned(_: tuple[str, int], timeout: float, source: Any = None) -> socket.socket:
        # Connect to the checked address; the name stays for Host, SNI and the certificate.
        return socket.create_connection((str(address), target.port), timeout, source)

    conn._create_connection = pinned  # type: ignore[attr-defined]
    return conn


HeaderSource = Callable[["Target", int], Mapping[str, str]]  # (hop's target, hop number) -> extra headers
AnswerCheck = Callable[["Target", http.client.HTTPResponse], None]  # raises FetchRefused to refuse an answer
FOLLOWED_METHODS = ("GET", "HEAD")  # redirects of any other method come back as they are
OVERRIDES = {"Accept-Encoding": "identity", "Connection": "close"}  # whatever the caller's headers say


def get(
    url: str,
    *,
    max_bytes: int,
    timeout: float,
    policy: FetchPolicy | None = None,
    method: str = "GET",
    headers: HeaderSource | None = None,
    body: bytes | None = None,
    check: AnswerCheck | None = None,
) -> Response:
    """One request, redirects followed (GET and HEAD only) and every hop checked. ``headers``
    is asked for each hop's extra headers, so a credential bound to one host is never carried
    by a redirect to another (``core.tools.credentials``). ``check`` sees the final answer's head
    before a byte of its body is read, and may refuse it (``FetchRefused``): a credentialed
    request's answer the redactor cannot read whole (``core.tools.credentials.whole_answer``)."""
    policy = policy or FetchPolicy()
    deadline = Deadline(timeout)
    redirects: list[str] = []
    try:
        target = parse_target(url)
        while True:
            try:
                extra = dict(headers(target, len(redirects))) if headers is not None else {}
                conn = _open(target, policy, deadline, method=method, extra=extra, body=body)
            except FetchRefused as exc:
                what = "follow a redirect to" if redirects else "fetch"
                raise FetchRefused(f"refusing to {what} {target.url}: {exc}") from None
            try:
                response = conn.getresponse()
                status = response.status
                location = response.getheader("Location")
                if status in REDIRECT_STATUSES and location and method in FOLLOWED_METHODS:
                    next_url = urllib.parse.urljoin(target.url, location)
                    if spells_a_value(next_url):  # first: no error quotes it, nothing is sent where it points
                        raise FetchRefused(
                            f"refusing to follow a redirect from {target.host}:{target.port}: its Location holds "
                            "the value of a credential or secret (an echo of a request's header): nothing sent there"
                        )
                    if len(redirects) >= policy.max_redirects:
                        raise FetchRefused(f"more than {policy.max_redirects} redirects, last to {location!r}")
                    target = _redirect_target(next_url)
                    redirects.append(next_url)
                    continue
                if check is not None:
                    check(target, response)
                data, more = _read_at_most(response, max_bytes + READ_PAST, conn, deadline)
                data, truncated = redacted_cut(data, max_bytes, more)
                return Response(
                    status=status,
                    content_type=response.getheader("Content-Type") or "(no content-type)",
                    charset=response.msg.get_content_charset() or "utf-8",
                    body=data,
                    truncated=truncated,
                    url=target.url,
                    redirects=redirects,
                )
            finally:
                deadline.watch(None)
                conn.close()
    except (FetchRefused, TimeoutError):
        raise
    except (OSError, http.client.HTTPException) as exc:
        if deadline.expired:
            raise deadline.error() from None
        raise ConnectionError(f"could not fetch {url}: {type(exc).__name__}: {exc}") from None
    finally:
        deadline.cancel()


DECODINGS = 3  # percent-decoded up to this many times over (a value encoded twice is no spelling)
_DELIMITERS = re.compile(r"[/?#&=;]")


def spells_a_value(url: str) -> bool:
    """Whether ``url`` holds a value this run opened or read (``observe.redaction.current``: a
    credential, a deployment secret), in any spelling the redactor knows (as it is,
    percent-encoded, base64, hex...), once percent-decoded up to DECODINGS times (``+`` a space
    or not: a value with every byte written ``%XX``, or encoded twice, is no spelling of its
    own, and a server decodes it), or with the URL's delimiters taken out (a value cut in two
    across the path and the query). No such URL is sent anywhere, a bound host included: agentq
    never puts a credential in a URL, so one there is an echo. A server that hides the value
    otherwise (cut around other text, reversed, enciphered) is the host it is bound to, trusted
    with it, choosing to give it away; what this stops is a reflection."""
    finder = current()
    views = level = {url}
    for _ in range(DECODINGS):
        level = {decode(v) for v in level for decode in (urllib.parse.unquote, urllib.parse.unquote_plus)} - views
        views = views | level
    return any(finder.redact(text) != text for view in views for text in (view, _DELIMITERS.sub("", view)))


def _redirect_target(url: str) -> Target:
    try:
        return parse_target(url)
    except FetchRefused as exc:
        raise FetchRefused(f"refusing to follow a redirect to {url!r}: {exc}") from None


def _open(
    target: Target,
    policy: FetchPolicy,
    deadline: Deadline,
    *,
    method: str = "GET",
    extra: Mapping[str, str] | None = None,
    body: bytes | None = None,
) -> http.client.HTTPConnection:
    """Connect to the first checked address that answers, and send the request."""
    last: Exception | None = None
    for address in resolve(target, policy, deadline):
        conn = _connection(target, address, deadline.remaining())
        try:
            conn.connect()
            deadline.watch(conn.sock)
            sent = _merged({"User-Agent": USER_AGENT, "Accept": "*/*"}, extra or {}, OVERRIDES)
            conn.request(method, target.path, body=body, headers=sent)
            return conn
        except ValueError:  # http.client's words quote the header and the offset in it: a credential's length
            conn.close()
            raise FetchRefused(
                "a request header holds a character HTTP/1.1 cannot carry (one outside Latin-1, or a line break): "
                "nothing sent"
            ) from None
        except OSError as exc:
            conn.close()
            if deadline.expired:
                raise deadline.error() from None
            last = exc
    raise ConnectionError(f"could not connect to {target.host}:{target.port}: {last}")


def _merged(*layers: Mapping[str, str]) -> dict[str, str]:
    """The headers of ``layers``, a later one's replacing an earlier one's of the same name in
    any case: a caller's ``accept-encoding: gzip`` is not sent beside agentq's ``identity``."""
    out: dict[str, str] = {}
    for layer in layers:
        for name, value in layer.items():
            for same in [n for n in out if n.lower() == name.lower()]:
                del out[same]
            out[name] = value
    return out


def _read_at_most(
    response: http.client.HTTPResponse, max_bytes: int, conn: http.client.HTTPConnection, deadline: Deadline
) -> tuple[bytes, bool]:
    """Read one byte past the limit to know whether anything was cut, never the whole body:
    a multi-gigabyte download must not be buffered just to be thrown away."""
    chunks: list[bytes] = []
    total = 0
    while total <= max_bytes:
        if conn.sock is not None:
            conn.sock.settimeout(deadline.remaining())
        chunk = response.read(min(CHUNK, max_bytes + 1 - total))
        if deadline.expired:
            raise deadline.error()
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    data = b"".join(chunks)
    return data[:max_bytes], total > max_bytes


def redacted_cut(data: bytes, max_bytes: int, more: bool) -> tuple[bytes, bool]:
    """What was read of a body (``more``: the body went on past it), redacted whole, then cut to
    ``max_bytes``; and whether anything was cut. Every credential the read holds whole is gone
    before the cut, wherever the model put it, in UTF-16 and UTF-32 too (``redact_encoded``,
    whatever charset the body names). The read's own end may cut one: its start lies in the last
    LONGEST_READ bytes read, so what they became is dropped (with a redaction that holds their
    first byte); READ_PAST leaves max_bytes to show when nothing was redacted."""
    clean = redact_encoded(data, upto=len(data) - LONGEST_READ if more else None)
    return clean[:max_bytes], more or len(clean) > max_bytes
