"""HTTPS from a workspace's shell: a sandbox that may reach allowed hosts has the host's public CA
certificates, read-only, so a client verifies a server's certificate through the egress
proxy's ``CONNECT`` tunnel (before, ``/etc/ssl`` was not there and every HTTPS client failed its
check); the tunnel carries real TLS end to end, the proxy never sees the plaintext; a sandbox
without network has no CA bundle and cannot write the one it has."""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentq.core.engine._workspace import TaskWorkspace
from agentq.core.tools import ToolContext, default_registry, idempotency_key_for
from agentq.core.tools.egress import EgressProxy
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.core.workspace import EMPTY
from agentq.sandbox.workspace import WorkspaceSandbox

from tests.certificates import issue

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
LOOPBACK = FetchPolicy(allow=(HostRule("127.0.0.1"),))  # the deployment lets loopback through
SECRET_PATH = "/hello"


def _ca_and_server_cert(tmp: Path) -> tuple[Path, Path, Path]:
    """A test CA (not in the host's bundle) and a certificate for 127.0.0.1 it signed."""
    certs = issue(tmp, "127.0.0.1")
    return certs.ca, certs.cert, certs.key


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello over tls"
        self.send_response(200 if self.path == SECRET_PATH else 404)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    ca, cert, key = _ca_and_server_cert(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], ca
    finally:
        server.shutdown()
        server.server_close()


def _workspace(tmp_path: Path, egress: EgressProxy | None) -> TaskWorkspace:
    directory = tmp_path / "root" / "task-a"
    directory.mkdir(parents=True)
    return TaskWorkspace("task-a", directory, EMPTY, set(), WorkspaceSandbox(), egress=egress)


def _sh(ws: TaskWorkspace, command: str) -> str:
    ctx = ToolContext("task-a", "toolu_1", idempotency_key_for("task-a", "toolu_1"), workspace=ws)
    out = default_registry().execute("shell", {"command": command, "timeout_seconds": 30}, ctx, ["shell"])
    assert out.status == "ok", out.content
    return out.content


def test_a_networked_shell_verifies_https_through_the_tunnel_with_the_hosts_public_cas(
    tmp_path: Path, tls_server: tuple[int, Path]
) -> None:
    port, ca = tls_server
    proxy = EgressProxy([HostRule("127.0.0.1", port)], LOOPBACK)
    try:
        ws = _workspace(tmp_path, proxy)
        (ws.directory / "ca.pem").write_bytes(ca.read_bytes())
        out = _sh(
            ws,
            'python3 -c \'import ssl; print("cas", ssl.create_default_context().cert_store_stats()["x509_ca"])\'; '
            f"curl -sS https://127.0.0.1:{port}{SECRET_PATH} 2>&1; echo; "  # the host's CAs: the test CA is not one
            f"curl -sS --cacert ca.pem https://127.0.0.1:{port}{SECRET_PATH}; echo; "
            "touch /etc/ssl/planted 2>&1 || echo read-only",
        )
    finally:
        proxy.close()
    cas = int(out.split("cas ", 1)[1].split()[0])
    assert cas > 10, out  # the public CAs are there (the host's bundle holds ~150)
    assert "unable to get local issuer certificate" in out or "self-signed" in out.lower(), out  # checked, refused
    assert "hello over tls" in out, out  # verified through CONNECT, end to end
    assert "read-only" in out and not Path("/etc/ssl/planted").exists()


def test_a_sandbox_without_network_has_no_ca_bundle(tmp_path: Path) -> None:
    out = _sh(_workspace(tmp_path, None), "ls /etc/ssl 2>&1; echo done")
    assert "No such file or directory" in out, out


def test_a_networked_shell_sees_the_certificate_stores_and_never_the_hosts_private_key_directories(
    tmp_path: Path,
) -> None:
    """/etc/ssl/private and /etc/pki/tls/private hold the host's TLS keys, and a root worker's
    sandbox is root outside its user namespace: only the certificate stores are bound, never
    their parents."""
    proxy = EgressProxy([HostRule("127.0.0.1", 1)], LOOPBACK)
    try:
        out = _sh(
            _workspace(tmp_path, proxy),
            "echo ssl: $(ls -A /etc/ssl 2>&1); echo pki: $(ls -A /etc/pki /etc/pki/tls 2>&1 | tr '\\n' ' '); "
            "ls /etc/ssl/private /etc/pki/tls/private 2>&1; echo done",
        )
    finally:
        proxy.close()
    ssl_line = out.split("ssl: ", 1)[1].splitlines()[0].split()
    assert set(ssl_line) <= {"certs", "openssl.cnf"} and "certs" in ssl_line, out
    assert "private" not in out.split("pki: ", 1)[1].splitlines()[0], out
    assert out.count("No such file or directory") >= 2, out
