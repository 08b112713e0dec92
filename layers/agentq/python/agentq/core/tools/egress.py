"""The egress proxy: the only way out of a workspace's shell, for a task that allows hosts.

The shell's sandbox has a network namespace of its own with nothing but loopback; there,
``127.0.0.1:3128`` leads (through the sandbox's first process, ``sandbox.runner._forward``) to
a Unix socket bound in from the worker, served here. Every connection is an HTTP proxy request,
``CONNECT host:port`` (https, git over https) or a plain request with an absolute URL (http);
the proxy contacts the destination only when

1. the task allows it (``WorkspaceSpec.allow_hosts``: ``host:port``, or ``host``, which allows
   ports 80 and 443 only), and
2. the deployment's SSRF guard lets it through (``core.tools.fetch.resolve``: the name resolved
   once and every address checked, public addresses only, unless the deployment's
   ``AGENTQ_HTTP_FETCH_ALLOW`` names an internal one), and it connects to the checked address.

A refusal is a ``403`` whose body names the reason, which git, curl and pip print; a request
that is not a proxy request is a ``400``. A plain http request is sent with ``Connection: close``,
so each request is checked on its own.

What it does not do yet (docs/SANDBOX.md): HTTPS through ``CONNECT`` passes, but the sandbox has
no CA bundle, so a client's certificate check fails; one thread per connection with no cap and
no read timeout; no test drives a refusal through it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import urllib.parse
from collections.abc import Callable

from agentq.core.tools.fetch import Deadline, FetchPolicy, FetchRefused, HostRule, Target, resolve

MAX_HEAD = 16 * 1024
CONNECT_SECONDS = 10.0
DEFAULT_PORTS = (80, 443)  # what a host rule without a port allows


class EgressProxy:
    def __init__(self, rules: list[HostRule], policy: FetchPolicy) -> None:
        self.rules = rules
        self.policy = policy
        # A directory of its own (0700) under the system's temporary one: a Unix socket's path
        # must stay under 108 bytes, which a workspace root of a deep path would pass.
        self._dir = tempfile.mkdtemp(prefix="agentq-egress-")
        self.path = os.path.join(self._dir, "proxy.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        os.chmod(self.path, 0o600)
        self._server.listen(64)
        self._closed = False
        self.refused: list[str] = []  # what it refused, for the trace and the tests
        threading.Thread(target=self._serve, name="agentq-egress", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            head, rest = _read_head(conn)
            if head is None:
                return
            line, _, headers = head.partition(b"\r\n")
            method, target, version = [*line.decode("latin-1").split(" "), "", ""][:3]
            host, port, origin = _destination(method, target)
            upstream = self._connect(host, port)
            if method.upper() == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    upstream.sendall(rest)
            else:
                kept = [
                    h
                    for h in headers.split(b"\r\n")
                    if h and not h.lower().startswith((b"proxy-connection:", b"connection:", b"proxy-authorization:"))
                ]
                request = f"{method} {origin} {version}\r\n".encode("latin-1")
                upstream.sendall(request + b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n" + rest)
            _pipe(conn, upstream)
        except BadRequest as exc:
            self.refused.append(str(exc))
            _answer(conn, 400, f"agentq egress: bad proxy request: {exc}")
        except FetchRefused as exc:
            self.refused.append(str(exc))
            _answer(conn, 403, f"agentq egress refused: {exc}")
        except OSError as exc:
            _answer(conn, 502, f"agentq egress could not connect: {exc}")
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def _connect(self, host: str, port: int) -> socket.socket:
        if not any(_allows(rule, host, port) for rule in self.rules):
            allowed = ", ".join(r.host + (f":{r.port}" if r.port else " (ports 80, 443)") for r in self.rules)
            raise FetchRefused(f"{host}:{port} is not among the hosts this task may reach ({allowed})")
        deadline = Deadline(CONNECT_SECONDS)
        try:
            addresses = resolve(Target(f"//{host}:{port}", "https", host, port, "/"), self.policy, deadline)
            last: OSError | None = None
            for address in addresses:
                try:
                    return socket.create_connection((str(address), port), timeout=deadline.remaining())
                except OSError as exc:
                    last = exc
            raise last or OSError(f"no address of {host} answered")
        finally:
            deadline.cancel()


class BadRequest(ValueError):
    """Not a proxy request this proxy takes: a ``400``."""


def _allows(rule: HostRule, host: str, port: int) -> bool:
    """A rule with a port allows that port; one without allows the web's ports, 80 and 443."""
    return rule.host == host and (port == rule.port if rule.port is not None else port in DEFAULT_PORTS)


def _read_head(conn: socket.socket) -> tuple[bytes | None, bytes]:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = conn.recv(4096)
        if not chunk:
            return None, b""
        buffer += chunk
        if len(buffer) > MAX_HEAD:
            raise BadRequest("the request head is over 16 KB")
    head, _, rest = buffer.partition(b"\r\n\r\n")
    return head, rest


def _destination(method: str, target: str) -> tuple[str, int, str]:
    """host, port and the origin-form path of a proxy request."""
    if method.upper() == "CONNECT":
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise BadRequest(f"CONNECT to {target!r}: expected host:port")
        return host.strip("[]").lower(), int(port), ""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise BadRequest(f"a proxy request needs an absolute http:// URL or CONNECT, not {target[:200]!r}")
    origin = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname.lower(), parts.port or 80, origin


def _pipe(a: socket.socket, b: socket.socket) -> None:
    def one_way(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=one_way, args=(b, a), daemon=True)
    other.start()
    one_way(a, b)
    other.join()
    with contextlib.suppress(OSError):
        b.close()


def _answer(conn: socket.socket, status: int, message: str) -> None:
    body = (message + "\n").encode()
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
    with contextlib.suppress(OSError):
        conn.sendall(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n".encode()
            + body
        )


def egress_factory(policy: FetchPolicy) -> Callable[[list[str]], EgressProxy]:
    """What the engine calls for a task whose workspace allows hosts (``Engine(egress=...)``)."""

    def make(allow_hosts: list[str]) -> EgressProxy:
        return EgressProxy([HostRule.parse(h) for h in allow_hosts], policy)

    return make
