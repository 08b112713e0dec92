"""The A2A client against DNS rebinding: a remote agent's name that resolves to a public address
when the guard checks it and to 127.0.0.1 when anything resolves it again. Every connection of
a contact (the card, the endpoint of a send or a look) must go to the address the guard checked,
never to the name again, so the internal service behind 127.0.0.1 sees no connection and no
credential (``core.tools.pinned_http``; docs/ARCHITECTURE.md invariant 8).

Real parts: ``RemoteAgents`` with the ``a2a-sdk`` client, the a2a-sdk server of
tests/a2a_servers/desk.py over https in a process of its own (127.0.0.2), and the internal
service, a TLS listener on 127.0.0.1 with a certificate for the attacker's name (the worst case:
a connection that reached it would complete its handshake and hand it the request). The DNS is
``socket.getaddrinfo`` answering as a rebinding attacker's server does (``Dns``); the outside
network is ``socket.socket.connect`` refusing the public address (``no_outside_network``).

The credential's binding is held as strictly: an agent's ``host`` without a port lets the card
name an endpoint on any port of it, but the credential goes only to a host:port the vault binds
it to (the last tests, against plain listeners on loopback)."""

from __future__ import annotations

import ipaddress
import os
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agentq.core.errors import AgentqError
from agentq.core.models import RemoteAgentRef
from agentq.core.tools.a2a_remote import RemoteAgents, RemoteUnreachable
from agentq.core.tools.pinned_http import BoundCredential, PinnedTransport, Pins
from agentq.core.vault import Credential, HostBinding

from tests.certificates import Certs, issue
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
NAME = "rebind.test"
PUBLIC = "93.184.216.34"  # what the attacker's DNS answers the check: a public address
GUARD_THREAD = "agentq-http-fetch-dns"  # the thread the guard resolves on (core.tools.fetch._getaddrinfo)
TOKEN = "RBND" + uuid.uuid4().hex


def _certs(tmp: Path) -> Certs:
    """A test CA and a certificate it signed for NAME only (no IP): verifying it against an
    address instead of the name fails."""
    return issue(tmp, NAME, ca_name="agentq rebinding test CA")


class Internal:
    """The internal service on 127.0.0.1: every connection it accepts, and every request head
    it read (over TLS, with NAME's certificate, so a client that reached it would talk)."""

    def __init__(self, port: int, certs: Certs) -> None:
        self.connections: list[Any] = []
        self.requests: list[str] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certs.cert, certs.key)
        internal = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                internal.connections.append(self.client_address)
                try:
                    with context.wrap_socket(self.request, server_side=True) as tls:
                        tls.settimeout(10)
                        head = b""
                        while b"\r\n\r\n" not in head and len(head) < 65536:
                            chunk = tls.recv(4096)
                            if not chunk:
                                break
                            head += chunk
                        internal.requests.append(head.decode(errors="replace"))
                        tls.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def credentials_seen(self) -> list[str]:
        return [r for r in self.requests if TOKEN in r]

    def clear(self) -> None:
        self.connections.clear()
        self.requests.clear()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class World:
    port: int  # the same port on 127.0.0.1 (the internal service) and 127.0.0.2 (the desk)
    certs: Certs
    internal: Internal
    ledger: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("rebinding")
    certs = _certs(tmp)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    internal = Internal(port, certs)
    ledger = tmp / "received.jsonl"
    env = {**os.environ, "DESK_TOKEN": TOKEN, "DESK_LEDGER": str(ledger), "PYTHONPATH": str(ROOT),
           "DESK_ENDPOINT": f"https://{NAME}:{port}/", "DESK_HOSTNAME": NAME}  # fmt: skip
    desk = subprocess.Popen(
        [sys.executable, "-m", "tests.a2a_servers.desk", "--host", "127.0.0.2", "--port", str(port),
         "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.2", port)) == 0

    try:
        wait_for(up, timeout=30, what="the a2a-sdk desk server over https")
        yield World(port, certs, internal, ledger)
    finally:
        desk.kill()
        desk.wait()
        internal.close()


@dataclass
class Dns:
    """NAME as a rebinding attacker's DNS answers it: the guard's lookups get ``checked``; any
    other lookup (a connection resolving the name again) gets 127.0.0.1, and is recorded."""

    checked: str
    at_check: int = 0
    elsewhere: list[str] = field(default_factory=list)


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch, world: World) -> Dns:
    monkeypatch.setenv("SSL_CERT_FILE", str(world.certs.ca))  # the test CA is the client's trust store
    world.internal.clear()
    answers = Dns(PUBLIC)
    real = socket.getaddrinfo

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)  # anyio asks in IDNA bytes
        if name.rstrip(".").lower() != NAME:
            return real(host, port, *args, **kwargs)
        if threading.current_thread().name == GUARD_THREAD:
            answers.at_check += 1
            address = answers.checked
        else:
            answers.elsewhere.append(threading.current_thread().name)
            address = "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0)))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    return answers


@pytest.fixture
def no_outside_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Connections to the public address are recorded and refused; any other goes through."""
    tried: list[Any] = []
    real = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> None:
        if isinstance(address, tuple) and address[0] == PUBLIC:
            tried.append(address)
            raise ConnectionRefusedError("test: no outside network")
        real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return tried


def _ref(port: int) -> RemoteAgentRef:
    return RemoteAgentRef.model_validate({
        "name": "desk", "card_url": f"https://{NAME}:{port}/.well-known/agent-card.json", "host": f"{NAME}:{port}",
        "credential": "desk-token",
    })  # fmt: skip


def _credential(port: int) -> Credential:
    return Credential("desk-token", "bearer", (HostBinding.parse(f"{NAME}:{port}"),), TOKEN)


def _failure(contact: Any) -> AgentqError:
    with pytest.raises(AgentqError) as raised:
        contact()
    return raised.value


def test_a_card_whose_name_rebinds_to_loopback_after_the_check_is_fetched_from_the_checked_address_only(
    world: World, dns: Dns, no_outside_network: list[Any]
) -> None:
    client, ref, credential = RemoteAgents(timeout=10), _ref(world.port), _credential(world.port)
    error = _failure(lambda: client.send(ref, "hello", key="k-card", credential=credential))
    assert world.internal.credentials_seen() == [] and world.internal.connections == []  # nothing at the inside
    assert dns.at_check >= 1 and dns.elsewhere == []  # checked, never resolved again
    assert no_outside_network == [(PUBLIC, world.port)]  # the one connection: to the checked address
    assert isinstance(error, RemoteUnreachable) and "nothing sent" in error.message, error


@pytest.mark.parametrize("contact", ["look", "answer"])
def test_an_endpoint_whose_name_rebinds_to_loopback_after_the_check_is_contacted_at_the_checked_address_only(
    world: World, dns: Dns, no_outside_network: list[Any], contact: str
) -> None:
    """A look at a recorded remote task, and the answer to its question: the endpoint the first
    contact recorded, checked again and reached at the address checked now."""
    remote = {"url": f"https://{NAME}:{world.port}/", "task_id": "t-1", "context_id": "c-1"}
    client, ref, credential = RemoteAgents(timeout=10), _ref(world.port), _credential(world.port)
    if contact == "look":
        error = _failure(lambda: client.look(ref, remote, credential))
    else:
        error = _failure(lambda: client.send(ref, "blue", key="k-answer", credential=credential, remote=remote))
    assert world.internal.credentials_seen() == [] and world.internal.connections == []
    assert dns.at_check >= 1 and dns.elsewhere == []
    assert no_outside_network == [(PUBLIC, world.port)]
    assert isinstance(error, RemoteUnreachable) and "nothing sent" in error.message, error


def test_a_host_the_deployment_names_is_pinned_too_and_https_keeps_its_name_for_sni_the_certificate_and_host(
    world: World, dns: Dns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator names NAME (AGENTQ_A2A_ALLOW): its answer is not refused, but the contact
    still goes where the check resolved it (the desk, on 127.0.0.2), not where a second lookup
    would (127.0.0.1). The desk's certificate is NAME's only and it answers only ``Host: NAME``;
    it refuses a request without the credential: a send and its looks complete through it."""
    monkeypatch.setenv("AGENTQ_A2A_ALLOW", f"{NAME}:{world.port}")
    dns.checked = "127.0.0.2"
    client, ref, credential = RemoteAgents(timeout=10), _ref(world.port), _credential(world.port)
    sent = client.send(ref, "hello", key="k-" + uuid.uuid4().hex, credential=credential)
    assert sent.task_id and sent.url == f"https://{NAME}:{world.port}/"
    world.ledger.with_name(world.ledger.name + ".release").touch()
    remote = {"url": sent.url, "task_id": sent.task_id, "context_id": sent.context_id}

    def completed() -> Any:
        view = client.look(ref, remote, credential)
        return view if view.state == "completed" else None

    ended = wait_for(completed, timeout=30, what="the desk's task to complete", interval=0.2)
    assert ended.text == "echo: hello"
    assert world.internal.credentials_seen() == [] and world.internal.connections == []
    assert dns.at_check >= 2 and dns.elsewhere == []


def test_a_connection_to_a_host_port_nothing_checked_is_refused_without_resolving_it(
    world: World, dns: Dns, no_outside_network: list[Any]
) -> None:
    """Fail closed: the transport connects only to what was pinned, host and port."""
    pins = Pins()
    pins.pin(NAME, 443, [ipaddress.ip_address(PUBLIC)])  # another port of the same name

    async def get(url: str) -> None:
        async with httpx.AsyncClient(transport=PinnedTransport(pins), trust_env=False) as http:
            await http.get(url)

    for url in (f"https://{NAME}:{world.port}/", f"http://127.0.0.1:{world.port}/"):
        with pytest.raises(httpx.ConnectError, match="no address of it was checked"):
            anyio.run(get, url)
    assert world.internal.connections == []
    assert dns.at_check == 0 and dns.elsewhere == []
    assert no_outside_network == []


class _Recorder:
    """A plain HTTP listener on loopback: the headers of every request it got, and what it
    answers (a card, or a JSON-RPC answer with a working task)."""

    def __init__(self, card: dict[str, Any] | None = None) -> None:
        import json
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.seen: list[dict[str, str]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None: ...

            def _answer(self, body: bytes) -> None:
                recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(json.dumps(card or {}).encode())

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                task = {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_WORKING"}}
                self._answer(json.dumps({"jsonrpc": "2.0", "id": request.get("id"), "result": {"task": task}}).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _card(endpoint: str) -> dict[str, Any]:
    return {
        "name": "far", "description": "d", "version": "1",
        "supportedInterfaces": [{"url": endpoint, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {}, "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
        "skills": [{"id": "s", "name": "s", "description": "d", "tags": []}],
    }  # fmt: skip


@pytest.mark.parametrize("contact", ["send", "look"])
def test_the_credential_is_not_sent_to_a_card_endpoint_on_a_port_its_binding_does_not_name(
    monkeypatch: pytest.MonkeyPatch, contact: str
) -> None:
    """The agent's ``host`` names 127.0.0.1 without a port (any port: the guard lets the card's
    endpoint on another port pass); the credential is bound to the card's host:port only. A card
    naming its endpoint on another port of the host does not get the credential sent there: the
    contact is refused naming the binding, and the endpoint gets no request at all. A look at an
    endpoint a first contact recorded is held to the binding as it is now, the same way."""
    endpoint = _Recorder()
    card = _Recorder(_card(f"http://127.0.0.1:{endpoint.port}/"))
    try:
        monkeypatch.setenv("AGENTQ_A2A_ALLOW", "127.0.0.1")  # the operator's word: loopback, any port
        ref = RemoteAgentRef.model_validate({
            "name": "far", "card_url": f"http://127.0.0.1:{card.port}/.well-known/agent-card.json",
            "host": "127.0.0.1", "credential": "far-key",
        })  # fmt: skip
        credential = Credential("far-key", "bearer", (HostBinding.parse(f"127.0.0.1:{card.port}"),), TOKEN)
        client = RemoteAgents(timeout=10)
        if contact == "send":
            error = _failure(lambda: client.send(ref, "hello", key="k-1", credential=credential))
        else:
            remote = {"url": f"http://127.0.0.1:{endpoint.port}/", "task_id": "t1", "context_id": "c1"}
            error = _failure(lambda: client.look(ref, remote, credential))
        assert error.field == "credential" and f"not 127.0.0.1:{endpoint.port}: not sent" in error.message, error
        assert endpoint.seen == []  # nothing reached the endpoint, credential or not
        assert len(card.seen) == (1 if contact == "send" else 0)  # the card read (a port the binding names)
    finally:
        endpoint.close()
        card.close()


def test_a_credential_header_goes_on_each_request_to_a_host_port_it_is_bound_to_and_on_no_other() -> None:
    """``BoundCredential`` decides per request: one client, two ports of one host, the header on
    the bound one only (a client-wide default header would go to both)."""
    bound, other = _Recorder(), _Recorder()
    credential = Credential("far-key", "bearer", (HostBinding.parse(f"127.0.0.1:{bound.port}"),), TOKEN)
    pins = Pins()
    for port in (bound.port, other.port):
        pins.pin("127.0.0.1", port, [ipaddress.ip_address("127.0.0.1")])

    async def both() -> None:
        async with httpx.AsyncClient(auth=BoundCredential(credential), transport=PinnedTransport(pins)) as http:
            await http.get(f"http://127.0.0.1:{bound.port}/")
            await http.post(f"http://127.0.0.1:{other.port}/", json={"id": 1})

    try:
        anyio.run(both)
    finally:
        bound.close()
        other.close()
    assert [h.get("authorization") for h in bound.seen] == [f"Bearer {TOKEN}"]
    assert [h.get("authorization") for h in other.seen] == [None]
