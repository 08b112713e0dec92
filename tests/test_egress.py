"""The workspace's egress proxy (core/tools/egress.py) driven over real sockets: a Unix-socket
client as the sandbox's forwarder is, loopback TCP servers as destinations. Every refusal is
checked to have contacted nothing, and every bound (connections, head time, idle time, close())
to hold while the clients misbehave. Waits are for observable events (an answer, an EOF, a
thread ending), each with a generous safety bound, never a fixed sleep."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentq.core.tools.egress import MAX_REFUSED, ContactMark, EgressProxy
from agentq.core.tools.fetch import FetchPolicy, HostRule

from tests.helpers import wait_for

SAFETY = 10.0  # the longest any answer may take before a test fails instead of hanging
LOOPBACK = FetchPolicy(allow=(HostRule("127.0.0.1"),))  # the deployment lets loopback through


class Listener:
    """A loopback TCP port. ``echo``: accept and echo each connection back, noting when its
    client ended; otherwise accept nothing, so ``contacted()`` tells if anyone connected."""

    def __init__(self, *, echo: bool = False) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.ended = threading.Event()  # an echoed connection saw its client's EOF
        if echo:
            threading.Thread(target=self._echo, daemon=True).start()

    def contacted(self) -> bool:
        self.sock.setblocking(False)
        try:
            self.sock.accept()[0].close()
        except BlockingIOError:
            return False
        return True

    def _echo(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                conn.sendall(chunk)
        self.ended.set()


@pytest.fixture
def make_proxy() -> Iterator[Callable[..., EgressProxy]]:
    made: list[EgressProxy] = []

    def make(hosts: list[str], policy: FetchPolicy = LOOPBACK, **limits: Any) -> EgressProxy:
        proxy = EgressProxy([HostRule.parse(h) for h in hosts], policy, **limits)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


def client(proxy: EgressProxy) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(SAFETY)
    sock.connect(proxy.path)
    return sock


def until_closed(sock: socket.socket) -> bytes:
    """Everything the proxy sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def ask(proxy: EgressProxy, head: bytes) -> bytes:
    with client(proxy) as sock:
        sock.sendall(head)
        return until_closed(sock)


def upstream_once(reply: bytes) -> tuple[int, list[bytes]]:
    """A server on a free port that reads one request head, notes it, answers ``reply`` and
    closes: (its port, the heads it saw)."""
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def answer_once() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            seen.append(data)
            conn.sendall(reply)

    threading.Thread(target=answer_once, daemon=True).start()
    return server.getsockname()[1], seen


def connect_head(host: str, port: int) -> bytes:
    return f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


def get_head(host: str, port: int, path: str = "/") -> bytes:
    return f"GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


def handler_threads() -> int:
    return sum(t.name == "agentq-egress-conn" for t in threading.enumerate())


@pytest.mark.parametrize("form", [connect_head, get_head])
def test_a_host_the_task_does_not_allow_is_refused_with_403_and_nothing_is_contacted(
    make_proxy: Callable[..., EgressProxy], form: Callable[[str, int], bytes]
) -> None:
    target = Listener()  # the deployment's guard would let it through: only the task's rule refuses
    proxy = make_proxy(["example.com:443", "git.example.org"])
    for host in ["127.0.0.1", "localhost", "example.org", "git.example.org.evil.test"]:
        answer = ask(proxy, form(host, target.port))
        assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), answer
        assert f"{host}:{target.port} is not among the hosts this task may reach".encode() in answer
        assert b"example.com:443, git.example.org (ports 80, 443)" in answer
    assert not target.contacted()
    assert len(proxy.refused) == 4


@pytest.mark.parametrize("form", [connect_head, get_head])
def test_an_armed_call_records_once_before_its_first_contact_and_a_failed_record_contacts_nothing(
    make_proxy: Callable[..., EgressProxy], form: Callable[[str, int], bytes]
) -> None:
    """The engine's at-most-once record of a networked call (core.engine._tool_call.NetworkedCall):
    it runs before the destination is contacted, once per call however many connections; a
    record that fails (a zombie's fenced write) refuses every connection of the call, and a
    refusal by the task's rules records nothing."""
    target = Listener()
    proxy = make_proxy([f"127.0.0.1:{target.port}"])
    seen: list[bool] = []
    mark = ContactMark(lambda: seen.append(target.contacted()))
    with proxy.armed(mark):
        assert ask(proxy, form("127.0.0.1", target.port + 1 if target.port < 65535 else 1)).startswith(b"HTTP/1.1 403")
        assert (mark.fired, seen) == (False, [])  # a refused destination is no contact
        for _ in range(3):
            with client(proxy) as sock:
                sock.sendall(form("127.0.0.1", target.port))
                wait_for(target.contacted, SAFETY, "the contact")
    assert mark.fired and seen == [False]  # once, and before the destination saw anything

    def fenced() -> None:
        raise RuntimeError("lease lost")

    refused = ContactMark(fenced)
    with proxy.armed(refused):
        for _ in range(2):
            answer = ask(proxy, form("127.0.0.1", target.port))
            assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n") and b"could not be recorded first" in answer
            assert b"lease lost" in answer
    assert not refused.fired and not target.contacted()


@pytest.mark.parametrize("rule", ["localhost", "127.0.0.1"])
def test_an_allowed_host_that_is_an_internal_address_is_refused_by_the_ssrf_guard(
    make_proxy: Callable[..., EgressProxy], rule: str
) -> None:
    target = Listener()
    proxy = make_proxy([f"{rule}:{target.port}"], FetchPolicy())  # no internal address allowed
    for form in (connect_head, get_head):
        answer = ask(proxy, form(rule, target.port))
        assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), answer
        assert b"is a loopback address" in answer
    assert not target.contacted()


def test_a_port_the_rule_does_not_name_is_refused(make_proxy: Callable[..., EgressProxy]) -> None:
    named, other = Listener(), Listener()
    proxy = make_proxy([f"127.0.0.1:{named.port}"])
    answer = ask(proxy, connect_head("127.0.0.1", other.port))
    assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), answer
    assert not other.contacted() and not named.contacted()


def test_a_rule_without_a_port_allows_only_80_and_443(make_proxy: Callable[..., EgressProxy]) -> None:
    target = Listener()
    proxy = make_proxy(["127.0.0.1"], FetchPolicy())  # the guard refuses loopback on any port
    for port in [1, 22, 79, 81, 442, 444, 8080, target.port, 65535]:
        answer = ask(proxy, connect_head("127.0.0.1", port))
        assert b"is not among the hosts this task may reach (127.0.0.1 (ports 80, 443))" in answer, (port, answer)
    for port in [80, 443]:  # past the task's rule: it is the guard that refuses these
        answer = ask(proxy, connect_head("127.0.0.1", port))
        assert b"is a loopback address" in answer, (port, answer)
    assert not target.contacted()


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"HELLO\r\n\r\n", b"needs an absolute http:// URL or CONNECT"),
        (b"\r\n\r\n", b"needs an absolute http:// URL or CONNECT"),
        (b"GET /relative HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"needs an absolute http:// URL or CONNECT"),
        (b"GET https://127.0.0.1/ HTTP/1.1\r\n\r\n", b"needs an absolute http:// URL or CONNECT"),
        (b"GET ftp://127.0.0.1/ HTTP/1.1\r\n\r\n", b"needs an absolute http:// URL or CONNECT"),
        (b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n", b"expected host:port"),
        (b"CONNECT :443 HTTP/1.1\r\n\r\n", b"expected host:port"),
        (b"CONNECT 127.0.0.1:https HTTP/1.1\r\n\r\n", b"expected host:port"),
        (b"GET http://127.0.0.1/ HTTP/1.1\r\nX: " + b"a" * 17_000 + b"\r\n\r\n", b"the request head is over 16 KB"),
    ],
)
def test_a_malformed_request_is_answered_400_naming_the_problem(
    make_proxy: Callable[..., EgressProxy], head: bytes, why: bytes
) -> None:
    proxy = make_proxy(["127.0.0.1:80", "127.0.0.1:443"])
    answer = ask(proxy, head)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
    assert why in answer


def test_an_absolute_url_request_reaches_the_allowed_host_as_origin_form_with_connection_close(
    make_proxy: Callable[..., EgressProxy],
) -> None:
    port, seen = upstream_once(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    proxy = make_proxy([f"127.0.0.1:{port}"])
    answer = ask(
        proxy,
        f"GET http://127.0.0.1:{port}/a/b?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eDp5\r\nConnection: keep-alive\r\n\r\n".encode(),
    )
    assert answer == b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    request = seen[0].decode("latin-1")
    assert request.startswith("GET /a/b?q=1 HTTP/1.1\r\n")
    assert "Connection: close\r\n" in request
    assert "keep-alive" not in request and "Proxy-" not in request


@pytest.mark.parametrize(
    "line",
    [b"Host : attacker.example.net", b":authority: attacker.example.net", b" Host: attacker.example.net", b"Host"],
)
def test_a_header_line_a_server_might_read_as_another_host_is_answered_400_and_nothing_is_contacted(
    make_proxy: Callable[..., EgressProxy], line: bytes
) -> None:
    """A space before the colon, a pseudo-header, a line folded onto the one before: a server
    behind that reads one of them as ``Host`` would route by a header the proxy had dropped."""
    target = Listener()
    proxy = make_proxy([f"127.0.0.1:{target.port}"])
    head = f"GET http://127.0.0.1:{target.port}/ HTTP/1.1\r\nX-A: b\r\n".encode() + line + b"\r\n\r\n"
    answer = ask(proxy, head)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
    assert b"a header line that is not 'name: value'" in answer
    assert not target.contacted()


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"GET http://127.0.0.1:PORT/ HTTP/1.1\nX-Forwarded-Host: evil.example.net\r\n\r\n", b"in the request line"),
        (b"GET http://127.0.0.1:PORT/ HTTP/1.1\r\nAccept: x\nHost: evil.example.net\r\n\r\n", b"in a header line"),
        (b"GET http://127.0.0.1:PORT/ HTTP/1.1\r\nAccept: x\rHost: evil.example.net\r\n\r\n", b"in a header line"),
        (b"GET http://127.0.0.1:PORT/ HTTP/1.1\r\nAccept: x\x00Host: evil.example.net\r\n\r\n", b"in a header line"),
        (b"G@T http://127.0.0.1:PORT/ HTTP/1.1\r\n\r\n", b"a method that is not a token"),
        (b"GET http://127.0.0.1:PORT/ HTTP/2\r\n\r\n", b"a version that is not HTTP/1.0 or HTTP/1.1"),
        (b"GET http://127.0.0.1:PORT/ HTTP/1.1 X\r\n\r\n", b"a request line that is not 'METHOD URL HTTP/1.x'"),
    ],
)
def test_a_bare_cr_or_lf_a_control_character_a_bad_method_or_version_is_answered_400_and_nothing_is_contacted(
    make_proxy: Callable[..., EgressProxy], head: bytes, why: bytes
) -> None:
    """A server that ends a line at a bare LF (or CR) would read what follows it in the request
    line or in a header value as another header, a ``Host`` the proxy never dropped, on a request
    that may carry a credential; a method or version a server might parse some other way is
    refused with them."""
    target = Listener()
    proxy = make_proxy([f"127.0.0.1:{target.port}"])
    answer = ask(proxy, head.replace(b"PORT", str(target.port).encode()))
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
    assert why in answer
    assert not target.contacted()


def test_a_tab_in_a_header_value_is_passed_on(make_proxy: Callable[..., EgressProxy]) -> None:
    port, seen = upstream_once(b"HTTP/1.0 204 No Content\r\n\r\n")
    proxy = make_proxy([f"127.0.0.1:{port}"])
    answer = ask(proxy, f"GET http://127.0.0.1:{port}/ HTTP/1.0\r\nAccept: a\tb\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.0 204 "), answer
    assert b"\r\nAccept: a\tb\r\n" in seen[0]


def test_over_the_connection_cap_a_connection_is_refused_at_once_and_threads_stay_bounded(
    make_proxy: Callable[..., EgressProxy],
) -> None:
    wait_for(lambda: handler_threads() == 0, SAFETY, "earlier tests' connections to end")
    cap = 4
    proxy = make_proxy(["127.0.0.1:443"], max_connections=cap, head_seconds=60)
    idle = [client(proxy) for _ in range(cap)]  # each holds a slot, sending nothing
    for _ in range(3 * cap):
        started = time.monotonic()
        with client(proxy) as extra:
            answer = until_closed(extra)
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
        assert f"over {cap} connections at once".encode() in answer
        assert time.monotonic() - started < SAFETY / 2
        assert handler_threads() <= cap
    for sock in idle:  # the idle ones were kept, not answered
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(1)
    idle.pop().close()  # a slot frees when its connection ends
    wait_for(lambda: handler_threads() < cap, SAFETY, "the closed connection's thread to end")
    with client(proxy) as sock:
        sock.sendall(b"HELLO\r\n\r\n")
        assert until_closed(sock).startswith(b"HTTP/1.1 400 ")
    for sock in idle:
        sock.close()


def test_a_client_that_sends_no_complete_head_is_answered_408_after_the_head_timeout(
    make_proxy: Callable[..., EgressProxy],
) -> None:
    proxy = make_proxy(["127.0.0.1:443"], head_seconds=0.5)
    for opening in [b"", b"CONNECT 127.0.0.1:443 HTTP/1.1\r\n"]:
        started = time.monotonic()
        with client(proxy) as sock:
            sock.sendall(opening)
            answer = until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
        assert 0.5 <= time.monotonic() - started < SAFETY / 2
    # The limit is for the whole head: a byte every 0.1 s does not extend it.
    started = time.monotonic()
    with client(proxy) as sock:
        sock.settimeout(0.1)
        answer = b""
        for byte in b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nX: " + b"a" * 200:
            try:
                answer = sock.recv(65536)  # the proxy's answer, or 0.1 s without one
                break
            except TimeoutError:
                sock.send(bytes([byte]))
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert time.monotonic() - started < 5


def test_a_tunnel_with_no_bytes_either_way_is_closed_after_the_idle_timeout(
    make_proxy: Callable[..., EgressProxy],
) -> None:
    echo = Listener(echo=True)
    proxy = make_proxy([f"127.0.0.1:{echo.port}"], idle_seconds=0.5)
    with client(proxy) as sock:
        sock.sendall(connect_head("127.0.0.1", echo.port) + b"ping")
        data = b""
        while not data.endswith(b"ping"):
            data += sock.recv(65536)
        assert data == b"HTTP/1.1 200 Connection established\r\n\r\nping"
        started = time.monotonic()
        assert sock.recv(65536) == b""  # closed by the proxy, not by us
        assert 0.5 <= time.monotonic() - started < SAFETY / 2
    assert echo.ended.wait(SAFETY)  # and the destination's side was closed too


def test_close_ends_live_tunnels_and_waiting_heads_and_their_threads(make_proxy: Callable[..., EgressProxy]) -> None:
    wait_for(lambda: handler_threads() == 0, SAFETY, "earlier tests' connections to end")
    echo = Listener(echo=True)
    proxy = make_proxy([f"127.0.0.1:{echo.port}"])  # default limits: minutes
    tunnel, waiting = client(proxy), client(proxy)
    tunnel.sendall(connect_head("127.0.0.1", echo.port) + b"ping")
    data = b""
    while not data.endswith(b"ping"):
        data += tunnel.recv(65536)
    wait_for(lambda: handler_threads() == 2, SAFETY, "both connections to be handled")
    proxy.close()
    assert until_closed(tunnel) == b""
    assert until_closed(waiting) == b""
    assert echo.ended.wait(SAFETY)
    wait_for(lambda: handler_threads() == 0, SAFETY, "the proxy's threads to end")
    wait_for(lambda: not any(t.name == "agentq-egress" for t in threading.enumerate()), SAFETY, "the acceptor")
    tunnel.close()
    waiting.close()


def test_the_refusals_kept_are_the_last_hundred(make_proxy: Callable[..., EgressProxy]) -> None:
    proxy = make_proxy(["127.0.0.1:443"])
    for port in range(1, MAX_REFUSED + 51):
        ask(proxy, connect_head("127.0.0.1", port))
    assert MAX_REFUSED == 100
    assert len(proxy.refused) == MAX_REFUSED
    assert proxy.refused[-1].startswith(f"127.0.0.1:{MAX_REFUSED + 50} ")
    assert proxy.refused[0].startswith("127.0.0.1:51 ")


METADATA = ["169.254.169.254", "[fd00:ec2::254]", "169.254.170.2"]  # EC2 IMDS (v4, v6), ECS task credentials


@pytest.mark.parametrize("host", METADATA)
def test_the_metadata_endpoints_are_refused_even_when_the_task_and_the_deployment_name_them(
    make_proxy: Callable[..., EgressProxy], host: str
) -> None:
    """On the EC2 workspace tier the instance metadata service holds the instance role's
    credentials: a task allowing the address, and even a deployment naming it as an internal
    address it lets through (AGENTQ_HTTP_FETCH_ALLOW), never gets a connection to it."""
    bare = host.strip("[]")
    named = FetchPolicy(allow=(HostRule.parse(host),))  # the operator wrote this exact address
    for policy in (FetchPolicy(), named):
        proxy = make_proxy([host], policy)
        for form in (connect_head, get_head):
            for port in (80, 443):
                started = time.monotonic()
                answer = ask(proxy, form(host, port))
                assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), (policy, answer)
                assert b"metadata or credentials endpoint" in answer and bare.encode() in answer
                assert time.monotonic() - started < SAFETY / 2  # refused before any connection was tried
        assert proxy.refused and all("metadata" in r for r in map(str, proxy.refused))


def _request_end(data: bytes) -> int | None:
    """Where the first request in ``data`` ends (its head, and the body its Content-Length or
    chunked framing gives), or None while it is incomplete or cannot be read."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    at = head_end + 4
    head = data[:head_end].lower()
    if b"\r\ntransfer-encoding: chunked" not in head:
        length = head.partition(b"\r\ncontent-length: ")[2].partition(b"\r\n")[0]
        return at + int(length or 0) if len(data) >= at + int(length or 0) else None
    while True:  # chunks, then a trailer section ending in an empty line
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            return None
        try:
            size = int(data[at:line_end].partition(b";")[0], 16)
        except ValueError:
            return None
        at = line_end + 2
        if size == 0:
            while (line_end := data.find(b"\r\n", at)) >= 0:
                at, line = line_end + 2, data[at:line_end]
                if not line:
                    return at
            return None
        at += size + 2


class Upstream:
    """A destination on a free port that takes one connection and records every byte the proxy
    sends it (``received``): it reads the first request, answers ``reply`` (then ends its side
    unless ``keep_alive``, as a server honouring ``Connection: close`` does), and reads on until
    the proxy ends its side; ``done`` is set then."""

    def __init__(self, reply: bytes, *, keep_alive: bool = False) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.reply, self.keep_alive = reply, keep_alive
        self.received = b""
        self.first: bytes | None = None  # the first request, as the upstream read it
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn, contextlib.suppress(OSError):
            conn.settimeout(SAFETY)
            while chunk := conn.recv(65536):
                self.received += chunk
                end = _request_end(self.received)
                if self.first is None and end is not None:
                    self.first = self.received[:end]
                    conn.sendall(self.reply)
                    if not self.keep_alive:
                        conn.shutdown(socket.SHUT_WR)
        self.done.set()

    @property
    def after_first(self) -> bytes:
        """What the upstream got after the end of the first request."""
        assert self.first is not None, self.received
        return self.received[len(self.first) :]


REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
SECOND = [  # a request behind the first whose head the proxy would refuse or rewrite
    b"GET http://127.0.0.1:PORT/two HTTP/1.1\r\nHost: attacker.example.net\r\n\r\n",
    b"GET /two HTTP/1.1\r\nHost: attacker.example.net\r\nX-Forwarded-Host: attacker.example.net\r\n\r\n",
    b"GET http://127.0.0.1:PORT/two HTTP/1.1\r\nAuthorization: Bearer ${vault:github}\r\n\r\n",
    b"GET http://127.0.0.1:PORT/two HTTP/1.1\r\nHost : attacker.example.net\r\nAccept: x\nHost: evil\r\n\r\n",
    b"GET http://another.example.net/two HTTP/1.1\r\n\r\n",
]


@pytest.mark.parametrize("when", ["pipelined", "after the answer"])
@pytest.mark.parametrize("second", SECOND)
def test_a_second_request_on_a_connection_never_reaches_the_upstream(
    make_proxy: Callable[..., EgressProxy], second: bytes, when: str
) -> None:
    """The proxy checks one request head per connection: a second one in the same stream, sent
    with the first or on a connection kept alive after its answer (by a server that ignored
    ``Connection: close``), is dropped, never sent upstream unchecked."""
    upstream = Upstream(REPLY, keep_alive=when == "after the answer")
    proxy = make_proxy([f"127.0.0.1:{upstream.port}"])
    first = get_head("127.0.0.1", upstream.port, "/one")
    second = second.replace(b"PORT", str(upstream.port).encode())
    with client(proxy) as sock:
        if when == "pipelined":
            sock.sendall(first + second)
            answer = until_closed(sock)
        else:
            sock.sendall(first)
            answer = b""
            while len(answer) < len(REPLY):
                answer += sock.recv(65536)
            sock.sendall(second)
            sock.shutdown(socket.SHUT_WR)  # after the second request: the proxy reads it first
            answer += until_closed(sock)
    assert answer == REPLY
    assert upstream.done.wait(SAFETY)
    assert upstream.first is not None and upstream.first.startswith(b"GET /one HTTP/1.1\r\n")
    assert upstream.after_first == b""
    assert b"/two" not in upstream.received and b"attacker" not in upstream.received
    wait_for(lambda: any("one request per connection" in r for r in proxy.refused), SAFETY, "the refusal")
    assert f"{len(second)} bytes after the request to 127.0.0.1:{upstream.port} not sent" in proxy.refused[-1]


def test_a_body_longer_than_its_content_length_does_not_carry_its_tail_upstream(
    make_proxy: Callable[..., EgressProxy],
) -> None:
    upstream = Upstream(REPLY)
    proxy = make_proxy([f"127.0.0.1:{upstream.port}"])
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: attacker.example.net\r\n\r\n"
    answer = ask(
        proxy,
        f"POST http://127.0.0.1:{upstream.port}/form HTTP/1.1\r\nContent-Length: 5\r\n\r\n".encode()
        + b"hello"
        + smuggled,
    )
    assert answer == REPLY
    assert upstream.done.wait(SAFETY)
    assert upstream.first is not None and upstream.first.endswith(
        b"\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    )
    assert upstream.after_first == b"" and b"smuggled" not in upstream.received


def test_a_chunked_body_goes_upstream_as_framed_and_nothing_after_its_last_chunk(
    make_proxy: Callable[..., EgressProxy],
) -> None:
    """Re-framed as the proxy read it: a chunk extension and a trailer field (which a server may
    merge into the head) are not sent, and a request behind the last chunk is dropped."""
    upstream = Upstream(REPLY)
    proxy = make_proxy([f"127.0.0.1:{upstream.port}"])
    body = b'5;ext="x"\r\nhello\r\n0A\r\n' + b"w" * 10 + b"\r\n0\r\nHost: attacker.example.net\r\n\r\n"
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: attacker.example.net\r\n\r\n"
    head = f"POST http://127.0.0.1:{upstream.port}/up HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n".encode()
    with client(proxy) as sock:
        sock.sendall(head)
        for at in range(0, len(body + smuggled), 7):  # the framing read across many reads
            sock.sendall((body + smuggled)[at : at + 7])
        answer = until_closed(sock)
    assert answer == REPLY
    assert upstream.done.wait(SAFETY)
    assert upstream.first is not None
    sent_head, _, sent_body = upstream.first.partition(b"\r\n\r\n")
    assert sent_head.lower().count(b"transfer-encoding") == 1 and b"Transfer-Encoding: chunked" in sent_head
    assert sent_body == b"5\r\nhello\r\na\r\n" + b"w" * 10 + b"\r\n0\r\n\r\n"
    assert upstream.after_first == b"" and b"attacker" not in upstream.received


def test_a_request_with_a_body_reaches_the_upstream_whole(make_proxy: Callable[..., EgressProxy]) -> None:
    upstream = Upstream(REPLY)
    proxy = make_proxy([f"127.0.0.1:{upstream.port}"])
    body = bytes(range(256)) * 1200  # 300 KB, every byte value, past any one read
    head = f"PUT http://127.0.0.1:{upstream.port}/blob HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    assert ask(proxy, head + body) == REPLY
    assert upstream.done.wait(SAFETY)
    assert upstream.first is not None and upstream.first.endswith(b"\r\n\r\n" + body)
    assert upstream.after_first == b"" and not proxy.refused


@pytest.mark.parametrize(
    ("framing", "why"),
    [
        (b"Content-Length: 5\r\nTransfer-Encoding: chunked", b"both Content-Length and Transfer-Encoding"),
        (b"Transfer-Encoding: gzip, chunked", b"a Transfer-Encoding other than one 'chunked'"),
        (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked", b"a Transfer-Encoding other than one 'chunked'"),
        (b"Transfer-Encoding: identity", b"a Transfer-Encoding other than one 'chunked'"),
        (b"Content-Length: 5\r\nContent-Length: 6", b"a Content-Length that is not one number"),
        (b"Content-Length: 5, 5", b"a Content-Length that is not one number"),
        (b"Content-Length: +5", b"a Content-Length that is not one number"),
        (b"Content-Length: 0x5", b"a Content-Length that is not one number"),
        (b"Content-Length: -1", b"a Content-Length that is not one number"),
    ],
)
def test_a_body_whose_end_a_server_might_place_elsewhere_is_answered_400_and_nothing_is_contacted(
    make_proxy: Callable[..., EgressProxy], framing: bytes, why: bytes
) -> None:
    target = Listener()
    proxy = make_proxy([f"127.0.0.1:{target.port}"])
    head = f"POST http://127.0.0.1:{target.port}/ HTTP/1.1\r\n".encode() + framing + b"\r\n\r\n"
    answer = ask(proxy, head + b"hello")
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
    assert why in answer
    answer = ask(proxy, f"POST http://127.0.0.1:{target.port}/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    assert b"a Transfer-Encoding other than one 'chunked' in HTTP/1.1" in answer
    assert not target.contacted()


@pytest.mark.parametrize(
    "bad",
    [b"5\nhello\r\n", b"zz\r\n", b"5\r\nhelloX\r\n", b"5;a\x00b\r\nhello\r\n", b"5;" + b"e" * 5000 + b"\r\n"],
)
def test_a_broken_chunk_ends_the_request_and_nothing_after_it_is_sent(
    make_proxy: Callable[..., EgressProxy], bad: bytes
) -> None:
    upstream = Upstream(REPLY)  # never answers: the request never completes
    proxy = make_proxy([f"127.0.0.1:{upstream.port}"])
    head = f"POST http://127.0.0.1:{upstream.port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    smuggled = b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: attacker.example.net\r\n\r\n"
    with client(proxy) as sock:
        sock.sendall(head + b"3\r\nabc\r\n")
        wait_for(lambda: upstream.received.endswith(b"\r\n\r\n3\r\nabc\r\n"), SAFETY, "the first chunk upstream")
        sock.sendall(bad + smuggled)
        answer = until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
    assert upstream.done.wait(SAFETY)
    assert upstream.first is None and upstream.received.endswith(b"\r\n\r\n3\r\nabc\r\n"), upstream.received
    assert any("the rest of the request to" in r for r in proxy.refused)
