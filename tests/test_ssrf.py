"""http_fetch attacked: every spelling of an internal address, redirects into the inside,
DNS that changes its answer, and servers that never finish.

A real HTTP server listens on loopback and counts what reaches it. With the default policy
(what a deployment gets unless it names hosts) every probe must come back as a tool error
that says why, and the server must see nothing. Where a test needs to reach the server on
purpose it names its exact address in the deployment allowlist (``FetchPolicy.allow``); the
guard itself is never loosened.
"""

from __future__ import annotations

import http.server
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.core.tools import ToolContext, ToolExecution, ToolRegistry, default_registry, idempotency_key_for
from agentq.core.tools.addresses import refusal
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.runtime import Settings, build_registry


class Server:
    """A loopback HTTP server that records every request it receives."""

    def __init__(self, host: str = "127.0.0.1", family: int = socket.AF_INET) -> None:
        hits = self.hits = []  # type: list[str]
        redirects = self.redirects = {}  # type: dict[str, str]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                if self.path in redirects:
                    self.send_response(302)
                    self.send_header("Location", redirects[self.path])
                    self.end_headers()
                    return
                if self.path == "/drip-body":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    for _ in range(600):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.1)
                    return
                if self.path == "/drip-headers":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    for i in range(600):
                        self.wfile.write(f"X-Slow-{i}: y\r\n".encode())
                        self.wfile.flush()
                        time.sleep(0.1)
                    return
                body = b"internal secret"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class HTTPServer(http.server.ThreadingHTTPServer):
            address_family = family
            daemon_threads = True

        self.server = HTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture(scope="module")
def server6() -> Iterator[Server | None]:
    try:
        s = Server("::1", socket.AF_INET6)
    except OSError:
        yield None  # no IPv6 loopback here: the [::1] probes still go through the guard
        return
    yield s
    s.close()


def ctx() -> ToolContext:
    return ToolContext("task-ssrf", "toolu_1", idempotency_key_for("task-ssrf", "toolu_1"))


def fetch(registry: ToolRegistry, url: str, **extra: Any) -> ToolExecution:
    """A refusal comes at once; the limit is for a hang. 30 s, not 5: even an IP literal is
    resolved on a thread of its own, which a loaded machine starved past 5 s once."""
    return registry.execute("http_fetch", {"url": url, "timeout_seconds": 30, **extra}, ctx(), ["http_fetch"])


def assert_refused(result: ToolExecution, *words: str) -> None:
    assert result.is_error and result.status == "error", result.content
    assert result.content.startswith("ToolError: FetchRefused: "), result.content
    for word in words:
        assert word in result.content, (word, result.content)
    assert "internal secret" not in result.content


# Spellings of this host's loopback (and of "any address", which Linux connects to locally).
LOOPBACK_SPELLINGS = [
    ("127.0.0.1", "loopback"),
    ("localhost", "loopback"),
    ("LOCALHOST", "loopback"),
    ("localhost.", "loopback"),
    ("2130706433", "loopback"),  # decimal
    ("0x7f000001", "loopback"),  # hex
    ("0177.0.0.1", "loopback"),  # octal
    ("0x7f.0.0.1", "loopback"),
    ("127.1", "loopback"),  # short form
    ("127.0.0.2", "loopback"),
    ("0.0.0.0", "unspecified"),
    ("0", "unspecified"),
    ("[::1]", "loopback"),
    ("[::ffff:127.0.0.1]", "IPv4-mapped"),
    ("[::ffff:7f00:1]", "IPv4-mapped"),
    ("[0:0:0:0:0:ffff:127.0.0.1]", "IPv4-mapped"),
    ("[::127.0.0.1]", "IPv4-compatible"),
    ("[::]", "unspecified"),
    ("[64:ff9b::7f00:1]", "NAT64"),
    ("[2002:7f00:1::]", "6to4"),
]


@pytest.mark.parametrize(("host", "why"), LOOPBACK_SPELLINGS)
def test_every_spelling_of_loopback_is_refused_and_the_server_sees_nothing(server: Server, host: str, why: str) -> None:
    before = len(server.hits)
    result = fetch(default_registry(), f"http://{host}:{server.port}/secret")
    assert_refused(result, why, "only contacts public internet addresses")
    assert len(server.hits) == before


def test_ipv6_loopback_server_is_not_reached_either(server6: Server | None) -> None:
    port = server6.port if server6 else 8080
    before = len(server6.hits) if server6 else 0
    for host in ("[::1]", "localhost", "[0:0:0:0:0:0:0:1]"):
        assert_refused(fetch(default_registry(), f"http://{host}:{port}/secret"), "loopback")
    assert (len(server6.hits) if server6 else 0) == before


INTERNAL_ADDRESSES = [
    ("169.254.169.254", "metadata"),  # instance metadata (AWS, GCP, Azure)
    ("169.254.170.2", "metadata"),  # ECS task credentials: the Fargate worker's role
    ("169.254.170.23", "metadata"),
    ("[fd00:ec2::254]", "metadata"),
    ("100.100.100.200", "metadata"),
    ("169.254.1.1", "link-local"),
    ("[fe80::1]", "link-local"),
    ("10.0.0.1", "private"),
    ("172.16.5.4", "private"),
    ("192.168.1.1", "private"),
    ("[fd00::1]", "unique-local"),
    ("[fc00::5]", "unique-local"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("100.127.255.254", "carrier-grade NAT"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("[ff02::1]", "multicast"),
    ("255.255.255.255", "reserved"),
    ("240.0.0.1", "reserved"),
    ("192.0.2.10", "private"),  # documentation range (ipaddress files it under private)
    ("198.18.0.1", "benchmarking"),
    ("[fec0::1]", "site-local"),
    ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]", "Teredo"),
]


@pytest.mark.parametrize(("host", "why"), INTERNAL_ADDRESSES)
def test_private_link_local_metadata_cgnat_and_multicast_addresses_are_refused(host: str, why: str) -> None:
    assert_refused(fetch(default_registry(), f"http://{host}/latest/meta-data/"), why)


def test_public_addresses_pass_the_address_check() -> None:
    for text in ("8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "2a00:1450:4001:82a::200e"):
        assert refusal(ipaddress.ip_address(text)) is None, text


def test_a_name_resolving_to_any_internal_address_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mixed answers (one public, one internal) are refused whole: either could be used."""
    real = socket.getaddrinfo

    def fake(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        answers = {"mixed.test": ["93.184.216.34", "127.0.0.1"], "meta.test": ["169.254.169.254"]}
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answers[host]]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    assert_refused(fetch(default_registry(), "http://mixed.test/"), "mixed.test resolves to 127.0.0.1", "loopback")
    assert_refused(fetch(default_registry(), "http://meta.test/"), "resolves to 169.254.169.254", "metadata")


def test_the_connection_goes_to_the_checked_address_and_the_name_is_resolved_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DNS rebinding: the first answer is public, every later one loopback. The fetch must
    connect to the address it checked, not ask again."""
    lookups: list[str] = []
    connects: list[tuple[str, int]] = []
    real = socket.getaddrinfo

    def rebinding(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "127.0.0.1":  # a local stack's background thread in this process (its own moto): not the fetch
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        address = "93.184.216.34" if len(lookups) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    def no_network(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        connects.append(address)
        raise ConnectionRefusedError("test: no outside network")

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    monkeypatch.setattr(socket, "create_connection", no_network)
    result = fetch(default_registry(), "http://rebind.test:8080/")
    assert result.is_error and "could not connect to rebind.test:8080" in result.content
    assert lookups == ["rebind.test"]
    assert connects == [("93.184.216.34", 8080)]


# --- redirects --------------------------------------------------------------------------------


def redirector_policy(server: Server, *names: str) -> FetchPolicy:
    """The redirecting server by its exact address, plus host *names*: a name in the allowlist
    is still resolved and checked, so it is how a hop into the inside reaches the guard."""
    return FetchPolicy(allow=(HostRule("127.0.0.1", server.port), *(HostRule.parse(n) for n in names)))


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("http://localhost:{port}/secret", "localhost resolves to 127.0.0.1, which is a loopback address"),
        ("http://LocalHost.:{port}/secret", "loopback"),
        ("http://169.254.169.254/latest/meta-data/iam/", "not among the hosts"),
        ("http://[::1]:{port}/secret", "not among the hosts"),
        ("http://2130706433:{port}/secret", "not among the hosts"),
        ("file:///etc/passwd", "only fetches http:// and https://"),
        ("gopher://127.0.0.1:{port}/_GET", "only fetches http:// and https://"),
    ],
)
def test_redirects_into_the_inside_are_refused_at_the_hop(server: Server, location: str, why: str) -> None:
    path = f"/redirect-{abs(hash(location))}"
    server.redirects[path] = location.format(port=server.port)
    before = len(server.hits)
    registry = default_registry(fetch_policy=redirector_policy(server, "localhost"))
    result = fetch(registry, f"http://127.0.0.1:{server.port}{path}")
    assert_refused(result, "refusing to follow a redirect to ", why)
    assert server.hits[before:] == [path]  # the redirect was asked for; its target never was


def test_a_redirect_to_a_name_that_resolves_to_metadata_is_refused(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = socket.getaddrinfo

    def fake(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "metadata.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    server.redirects["/to-metadata"] = "http://metadata.test/latest/api/token"
    result = fetch(
        default_registry(fetch_policy=redirector_policy(server, "metadata.test")),
        f"http://127.0.0.1:{server.port}/to-metadata",
    )
    assert_refused(result, "refusing to follow a redirect to http://metadata.test/", "resolves to 169.254.169.254")


def test_a_redirect_within_the_allowed_server_is_followed(server: Server) -> None:
    server.redirects["/moved"] = "/final"
    result = fetch(default_registry(fetch_policy=redirector_policy(server)), f"http://127.0.0.1:{server.port}/moved")
    assert result.status == "ok", result.content
    assert result.content.startswith("HTTP 200 text/plain (after 1 redirect(s), from http://127.0.0.1:")
    assert result.content.endswith("internal secret")


def test_redirect_chains_stop_after_the_limit(server: Server) -> None:
    for i in range(8):
        server.redirects[f"/loop{i}"] = f"/loop{i + 1}"
    result = fetch(default_registry(fetch_policy=redirector_policy(server)), f"http://127.0.0.1:{server.port}/loop0")
    assert_refused(result, "more than 5 redirects")


# --- the allowlist ----------------------------------------------------------------------------


def test_with_an_allowlist_every_other_host_is_refused(server: Server) -> None:
    registry = default_registry(fetch_policy=FetchPolicy(allow=(HostRule.parse("example.com"),)))
    assert_refused(
        fetch(registry, "http://example.org/"), "not among the hosts this deployment fetches from (example.com)"
    )
    assert_refused(fetch(registry, f"http://127.0.0.1:{server.port}/"), "not among the hosts")


def test_an_allowlisted_literal_admits_exactly_that_address_and_port(server: Server) -> None:
    registry = default_registry(fetch_policy=FetchPolicy(allow=(HostRule("127.0.0.1", server.port),)))
    assert fetch(registry, f"http://127.0.0.1:{server.port}/x").status == "ok"
    assert_refused(fetch(registry, f"http://127.0.0.1:{server.port + 1}/x"), "not among the hosts")
    assert_refused(fetch(registry, f"http://localhost:{server.port}/x"), "not among the hosts")


def test_the_allowlist_comes_from_the_deployment_environment(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(table="t", bucket="b")
    monkeypatch.setenv("AGENTQ_HTTP_FETCH_ALLOW", f" example.com, 127.0.0.1:{server.port} ,[::1]:99")
    assert fetch(build_registry(settings), f"http://127.0.0.1:{server.port}/x").status == "ok"
    monkeypatch.delenv("AGENTQ_HTTP_FETCH_ALLOW")
    assert_refused(fetch(build_registry(settings), f"http://127.0.0.1:{server.port}/x"), "loopback")
    policy = FetchPolicy.from_env({"AGENTQ_HTTP_FETCH_ALLOW": "Example.COM,10.0.0.7:8080,[::1]:99"})
    assert policy.allow == (HostRule("example.com"), HostRule("10.0.0.7", 8080), HostRule("::1", 99))
    with pytest.raises(ValueError, match="AGENTQ_HTTP_FETCH_ALLOW: 'http://x/' is not a host"):
        FetchPolicy.from_env({"AGENTQ_HTTP_FETCH_ALLOW": "http://x/"})


# --- one deadline for the whole fetch ---------------------------------------------------------


@pytest.mark.parametrize("path", ["/drip-body", "/drip-headers"])
def test_a_server_that_drips_bytes_is_cut_off_at_the_total_deadline(server: Server, path: str) -> None:
    """The server sends a byte (or a header line) every 0.1 s for a minute; no single read
    ever waits long. Only a deadline over the whole fetch ends it."""
    registry = default_registry(fetch_policy=FetchPolicy(allow=(HostRule("127.0.0.1", server.port),)))
    started = time.monotonic()
    result = registry.execute(
        "http_fetch",
        {"url": f"http://127.0.0.1:{server.port}{path}", "timeout_seconds": 1, "max_bytes": 1_000_000},
        ctx(),
        ["http_fetch"],
    )
    assert result.is_error
    assert result.content == "ToolError: TimeoutError: the fetch did not finish within its 1.0s deadline"
    assert time.monotonic() - started < 10  # not the minute the server would go on for
