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
that is not a proxy request is a ``400``. A plain http request is sent with ``Connection: close``
and with ``Host`` set to its URL's authority (the process's own ``Host`` and every header a shared
front end may route by dropped: ``DROPPED_HEADERS``), so a CDN or virtual host in front of an
allowed host cannot be steered to another site by the header.

One plain request per connection, and every byte the upstream gets of it checked: the head (its
line, destination and header lines, ``core.tools.egress_request``), then exactly the body the head
frames (``Content-Length``, or ``chunked`` re-framed as the proxy read it, extensions and trailer
fields dropped; both, or any other coding, is a ``400``), then nothing: whatever the client sends
after the body's end (a second request pipelined behind the first, a connection kept alive, a
body longer than its ``Content-Length``) is read and dropped, never sent, and the connection ends
when the upstream's answer does. Checking each request of a kept-alive connection in turn instead
would mean parsing the answers too (to know which answer is whose, and a second request may name
another host: another upstream), more code for a guard; a client whose connection ends opens a
new one, which is checked as the first was. A ``CONNECT`` tunnel is the other case: its bytes
pass as they are, to the one host and port checked, and carry nothing the proxy added.

The worker that runs the proxy is shared by other tenants' runs, so a shell must not be able to
pile threads or sockets up in it: at most ``MAX_CONNECTIONS`` connections at once per proxy, one
thread each (over the cap a connection is answered ``503`` at once, by the accepting thread);
``HEAD_SECONDS`` for a whole request head (then ``408``); a tunnel with no byte either way for
``IDLE_SECONDS`` is closed; ``close()`` (the end of the run) shuts every live connection down,
so no thread outlives the run; only the last ``MAX_REFUSED`` refusals are kept.

A call that reaches the network is a side effect (at most once, docs/ARCHITECTURE.md invariant 3):
while a tool call runs, the engine arms the proxy with a ``ContactMark`` (``armed``), and the
first connection the proxy is about to open to an allowed destination waits until the mark has
recorded the call's effect, fenced by the lease; a mark that cannot record (a zombie's lease is
lost) refuses the connection. So a call that never contacted a host leaves no effect record and
stays replay-safe, and one that did is never run again after a crash.

Credentials (``core.vault``): given the task's ``CredentialSource``, a plain http request to a
host one of the user's credentials is bound to gets that credential's header, added here (any
header of the same name the process sent is dropped): the process never holds the value, and the
credential goes nowhere but its hosts. It is read before the proxy contacts the host, with the
task's META (``core.engine._credentials``): a task no longer running under the worker's lease (a
stop's mark, cancelled, taken over) is answered ``403`` naming why, no credential added and
nothing sent, and its run is told, which kills the shell (ARCHITECTURE invariant 17). A
credential whose header is one that frames or routes a request (``core.vault.RESERVED_HEADERS``:
refused when it is written; one stored before) is not added after the checks above undid the
process's: the request is answered ``502`` naming it, and nothing is sent. The answer to a
request the proxy added a credential to is not passed on as it comes: a server may echo the
header (a debugging endpoint, an error page quoting the request), and the process, model-written
code, could reverse or re-encode the value before it prints it, past any redactor of what it
writes. The proxy asks for ``Accept-Encoding: identity`` (the process's ``Accept-Encoding``,
``TE``, ``Range``, ``If-Range`` and ``Accept-Charset`` dropped), reads the whole answer as its head frames it, and hands it back with every spelling of
the value it added redacted from its status line, headers and body, framed by a ``Content-Length``
of its own (``core.tools.egress_answer``); one it cannot redact (in a content coding, over
``MAX_ANSWER``, a ``206``, broken or cut short) is a ``502`` naming why, and none of its body
passes. Other requests' answers pass as they come. A ``CONNECT`` tunnel is end-to-end TLS the
proxy cannot add a header to: it passes as it is, *without* the credential, and the proxy
records that it refused to inject one (``refused``), so a workspace reaches a credentialed API
over http:// only (or through ``http_fetch`` or a tool's ``ctx.credential``, which do https).
What travels inside a tunnel (the TLS name, the ``Host`` behind it) is the process's: a shared
front end of an allowed host may route it elsewhere (domain fronting), which reaches nothing a
credential was added for.

HTTPS goes through ``CONNECT`` as a tunnel the proxy relays blind; the sandbox has the host's
public CA certificates (``sandbox.workspace.CA_BUNDLES``), so its clients verify the server.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator

from agentq.core.errors import AgentqError, LeaseLost
from agentq.core.pids import left_by_gone
from agentq.core.tools.egress_answer import ASK_IDENTITY, TRANSFORMING_HEADERS, Answer, AnswerRefused
from agentq.core.tools.egress_pipe import pipe
from agentq.core.tools.egress_request import (
    VERSION,
    BadBody,
    BadRequest,
    Body,
    HeadTimeout,
    destination,
    framing,
    header_fields,
    read_head,
    request_line,
)
from agentq.core.tools.fetch import Deadline, FetchPolicy, FetchRefused, HostRule, Target, resolve
from agentq.core.vault import Credential, CredentialRefused, CredentialSource
from agentq.observe.redaction import Values
from agentq.sandbox.bwrap import outside_owner

CONNECT_SECONDS = 10.0
MAX_CONNECTIONS = 32  # at once, per proxy (one task's run): a thread each
HEAD_SECONDS = 30.0  # for the whole request head
IDLE_SECONDS = 300.0  # a tunnel with no byte either way for this long is closed
MAX_REFUSED = 100  # refusals kept for the trace
DEFAULT_PORTS = (80, 443)  # what a host rule without a port allows
# What a plain request's head loses on its way upstream (lower-cased names). The hop's own headers
# (the proxy's, the connection's; an ``Upgrade`` would switch the connection to another protocol,
# h2c's with its own ``:authority``), and every header a shared front end (a CDN, a virtual host,
# a PaaS router) may route by: ``Host`` is the request URL's authority, always, so the request,
# and a credential added to it, reaches only the host the task was allowed and the credential is
# bound to; a forward proxy's client has no reason to send the reverse-proxy headers.
DROPPED_HEADERS = frozenset(
    {
        b"host",
        b"connection",
        b"proxy-connection",
        b"proxy-authorization",
        b"keep-alive",
        b"upgrade",
        b"http2-settings",
        b"forwarded",
        b"x-forwarded-host",
        b"x-forwarded-server",
        b"x-host",
        b"x-original-host",
        b"x-http-host-override",
    }
)


SOCKET_PREFIX = "agentq-egress-"
_SOCKET_DIRECTORY = re.compile(rf"^{re.escape(SOCKET_PREFIX)}(\d+)-[^/]+$")  # agentq-egress-<pid>-<random>
_swept = False  # this process has removed the dead processes' socket directories


def sweep_dead(directory: str | None = None) -> list[str]:
    """Once a process (or whenever ``directory`` is named): remove the proxies' directories
    (``agentq-egress-<pid>-*``, a socket each) that processes no longer alive left under
    ``directory`` (the system's temporary one) when they were killed before ``close()``."""
    global _swept
    if directory is None:
        if _swept:
            return []
        _swept = True
    where = directory or tempfile.gettempdir()
    swept = []
    for name in left_by_gone(where, _SOCKET_DIRECTORY):
        path = os.path.join(where, name)
        with contextlib.suppress(OSError):
            for entry in os.listdir(path):
                os.unlink(os.path.join(path, entry))
            os.rmdir(path)
            swept.append(path)
    return swept


class ContactMark:
    """What the proxy does before a tool call's first contact with a destination: ``record``
    (the engine's fenced effect record) runs once, under a lock, so a second connection of the
    same call waits for it; until it has returned, no connection is opened. If it raised, every
    connection of the call is refused with its reason."""

    def __init__(self, record: Callable[[], None]) -> None:
        self._record = record
        self._lock = threading.Lock()
        self.fired = False  # the record was written: the call reached (or was about to reach) the network
        self.error: str | None = None

    def __call__(self) -> None:
        with self._lock:
            if self.fired:
                return
            if self.error is None:
                try:
                    self._record()
                    self.fired = True
                    return
                except Exception as exc:  # a fenced write (lost lease), a store error: no contact
                    self.error = f"{type(exc).__name__}: {exc}"
            raise FetchRefused(f"the call's use of the network could not be recorded first ({self.error})")


class EgressProxy:
    """One task's proxy. Bounded: at most ``max_connections`` connections at once (one thread
    each; over the cap a connection is answered ``503`` at once), ``head_seconds`` for a request
    head, ``idle_seconds`` without a byte either way for a tunnel, and ``close()`` ends them all,
    because the worker that runs it is shared by other tenants' runs."""

    def __init__(
        self,
        rules: list[HostRule],
        policy: FetchPolicy,
        *,
        max_connections: int = MAX_CONNECTIONS,
        head_seconds: float = HEAD_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
        credentials: CredentialSource | None = None,
    ) -> None:
        self.rules = rules
        self.policy = policy
        self.credentials = credentials
        self.injected = 0  # requests the proxy added a credential to (for the trace and the tests)
        self.max_connections = max_connections
        self.head_seconds = head_seconds
        self.idle_seconds = idle_seconds
        # A directory of its own (0700) under the system's temporary one: a Unix socket's path
        # must stay under 108 bytes, which a workspace root of a deep path would pass. Named with
        # the process's pid, so a later process removes those a killed one left (``sweep_dead``).
        sweep_dead()
        self._dir = tempfile.mkdtemp(prefix=f"{SOCKET_PREFIX}{os.getpid()}-")
        self.path = os.path.join(self._dir, "proxy.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        os.chmod(self.path, 0o600)
        owner = outside_owner()
        if owner is not None:  # a root worker's sandbox connects as uid 65534 (sandbox.bwrap)
            os.chown(self.path, *owner)
        self._server.listen(64)
        self._closed = False
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()  # every open socket of a connection, for close()
        # One answer redacted at a time: a run's connections take turns at the CPU (and memory)
        # it costs, in a worker other tenants' runs share.
        self._redacting = threading.Lock()
        # What it refused, for the trace and the tests: the last MAX_REFUSED only.
        self.refused: collections.deque[str] = collections.deque(maxlen=MAX_REFUSED)
        self._mark: ContactMark | None = None  # the running call's (``armed``); None: contact freely
        self._acceptor = threading.Thread(target=self._serve, name="agentq-egress", daemon=True)
        self._acceptor.start()

    @contextlib.contextmanager
    def armed(self, mark: ContactMark) -> Iterator[ContactMark]:
        """While a tool call runs: its first contact with a destination runs ``mark`` first."""
        self._mark = mark
        try:
            yield mark
        finally:
            self._mark = None

    def close(self) -> None:
        """Stops accepting and ends every live connection (a blocked read returns at once)."""
        with self._lock:
            self._closed = True
            live = list(self._live)
        for sock in [self._server, *live]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept/recv/select
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
            if not self._slots.acquire(blocking=False):
                self.refused.append(f"over {self.max_connections} connections at once")
                _answer(conn, 503, f"agentq egress refused: over {self.max_connections} connections at once")
                with contextlib.suppress(OSError):
                    conn.close()
                continue
            threading.Thread(target=self._handle, args=(conn,), name="agentq-egress-conn", daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._live.add(sock)
            closed = self._closed
        if closed:  # close() ran before this socket was known to it
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _handle(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        answer: Answer | None = None  # a credentialed request's, read whole and redacted
        try:
            self._track(conn)
            head, rest = read_head(conn, self.head_seconds)
            if head is None:
                return
            line, _, headers = head.partition(b"\r\n")
            method, target, version = request_line(line)
            host, port, origin = destination(method, target)
            if not VERSION.fullmatch(version):  # after the URL's own 400, which names it
                raise BadRequest(f"a version that is not HTTP/1.0 or HTTP/1.1: {version[:100]!r}")
            authority = host if ":" not in host else f"[{host}]"
            authority += f":{port}" if port != 80 else ""
            body: Body | None = None  # a tunnel's bytes pass as they are
            fields: list[bytes] = []
            credential: Credential | None = None
            if method.upper() != "CONNECT":  # checked before any contact
                fields, body = framing(header_fields(headers), version)
                if self.credentials is not None:  # read (and refused: a task stopped) before any contact
                    self._allowed(host, port)
                    credential = self.credentials.for_host(host, port)
            upstream = self._connect(host, port)
            self._track(upstream)
            if body is None:  # CONNECT: never carries a credential, so none is read (its name is the listing's)
                name = self.credentials.bound_to(host, port) if self.credentials is not None else None
                if name is not None:
                    self.refused.append(
                        f"credential {name!r} not added to a CONNECT tunnel to {host}:{port}: "
                        "the proxy cannot add a header inside TLS"
                    )
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    upstream.sendall(rest)
            else:
                dropped = set(DROPPED_HEADERS)
                added: list[bytes] = []
                if credential is not None:
                    line = _header_line(credential)
                    dropped |= {line.partition(b":")[0].lower(), *TRANSFORMING_HEADERS}
                    added += [line, ASK_IDENTITY]
                    answer = Answer(Values(*credential.secret_forms()), method)
                    self.injected += 1
                kept = [h for h in fields if h.partition(b":")[0].lower() not in dropped]
                request = f"{method} {origin} {version}\r\nHost: {authority}\r\n".encode("latin-1")
                head = request + b"\r\n".join([*kept, *added, b"Connection: close"]) + b"\r\n\r\n"
                upstream.sendall(head + body.feed(rest))
            pipe(conn, upstream, self.idle_seconds, body, answer)
            if answer is not None:
                with self._redacting:
                    redacted = answer.redacted()
                conn.sendall(redacted)
            if body is not None and body.dropped:
                self.refused.append(
                    f"{body.dropped} bytes after the request to {host}:{port} not sent: one request per connection"
                )
        except HeadTimeout as exc:
            self.refused.append(str(exc))
            _answer(conn, 408, f"agentq egress: {exc}")
        except BadBody as exc:
            self.refused.append(f"{exc}: the rest of the request to {host}:{port} not sent")
            if not exc.answered:
                _answer(conn, 400, f"agentq egress: bad request body: {exc}")
        except BadRequest as exc:
            self.refused.append(str(exc))
            _answer(conn, 400, f"agentq egress: bad proxy request: {exc}")
        except FetchRefused as exc:
            self.refused.append(str(exc))
            _answer(conn, 403, f"agentq egress refused: {exc}")
        except LeaseLost as exc:  # the task was stopped, cancelled or taken over: its run is over
            reason = f"{exc.message}: no credential added to the request to {host}:{port}, nothing sent"
            self.refused.append(reason)
            _answer(conn, 403, f"agentq egress refused: {reason}")
        except AnswerRefused as exc:
            assert answer is not None
            reason = answer.values.redact(f"the answer from {host}:{port} not passed on: {exc}")
            self.refused.append(reason)
            _answer(conn, 502, f"agentq egress: {reason}")
        except OSError as exc:
            _answer(conn, 502, f"agentq egress could not connect: {exc}")
        except AgentqError as exc:  # the vault could not be read: nothing was sent
            self.refused.append(exc.message)
            _answer(conn, 502, f"agentq egress: {exc.message}")
        finally:
            with self._lock:
                self._live.discard(conn)
                if upstream is not None:
                    self._live.discard(upstream)
            for sock in (conn, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
            self._slots.release()

    def _allowed(self, host: str, port: int) -> None:
        if not any(allows(rule, host, port) for rule in self.rules):
            allowed = ", ".join(r.host + (f":{r.port}" if r.port else " (ports 80, 443)") for r in self.rules)
            raise FetchRefused(f"{host}:{port} is not among the hosts this task may reach ({allowed})")

    def _connect(self, host: str, port: int) -> socket.socket:
        self._allowed(host, port)
        deadline = Deadline(CONNECT_SECONDS)
        try:
            addresses = resolve(Target(f"//{host}:{port}", "https", host, port, "/"), self.policy, deadline)
            mark = self._mark
            if mark is not None:
                mark()  # the call's effect is recorded before anything leaves the worker
            last: OSError | None = None
            for address in addresses:
                try:
                    return socket.create_connection((str(address), port), timeout=deadline.remaining())
                except OSError as exc:
                    last = exc
            raise last or OSError(f"no address of {host} answered")
        finally:
            deadline.cancel()


def _header_line(credential: Credential) -> bytes:
    """The credential's header line as HTTP/1.1 carries it (Latin-1); one that does not encode is
    ``CredentialRefused`` in words that quote none of it (a ``UnicodeEncodeError`` names the
    character and its offset), answered 502, nothing sent."""
    name, value = credential.header()
    try:
        return f"{name}: {value}".encode("latin-1")
    except UnicodeEncodeError:
        raise CredentialRefused(
            f"credential {credential.name!r}'s header holds a character HTTP/1.1 cannot carry: not sent",
            field="credential",
        ) from None


def allows(rule: HostRule, host: str, port: int) -> bool:
    """A rule with a port allows that port; one without allows the web's ports, 80 and 443."""
    return rule.host == host and (port == rule.port if rule.port is not None else port in DEFAULT_PORTS)


def _answer(conn: socket.socket, status: int, message: str) -> None:
    body = (message + "\n").encode()
    reason = {
        400: "Bad Request",
        403: "Forbidden",
        408: "Request Timeout",
        502: "Bad Gateway",
        503: "Service Unavailable",
    }[status]
    with contextlib.suppress(OSError):
        # Nothing was sent on this socket before, so the answer fits its buffer: never wait
        # for a client that does not read (the acceptor thread answers the 503s).
        conn.setblocking(False)
        conn.sendall(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n".encode()
            + body
        )


def egress_factory(policy: FetchPolicy) -> Callable[..., EgressProxy]:
    """What the engine calls for a task whose workspace allows hosts (``Engine(egress=...)``),
    with the task's credentials when it has a vault."""

    def make(allow_hosts: list[str], credentials: CredentialSource | None = None) -> EgressProxy:
        return EgressProxy([HostRule.parse(h) for h in allow_hosts], policy, credentials=credentials)

    return make
