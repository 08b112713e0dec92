"""The local API server at the socket (``api/http_guard.py``): what it checks before it reads a
body or calls the handler, each refusal a JSON error, and no request that hangs a thread.

Requests are written by hand on a socket: the malformed ones are what no HTTP client sends."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.api.http_server import ApiServer
from agentq.api.models import MAX_BODY_BYTES

from tests.api_support import ApiStack

BODY_SECONDS = 0.5  # the test server's deadline for a body; the clients wait far longer (10 s)


@pytest.fixture
def keyless() -> Iterator[tuple[ApiServer, list[dict[str, Any]]]]:
    """A keyless server (as `agentq dev`) whose handler records each event it gets and answers 200."""
    seen: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        seen.append(event)
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps({"ok": True})}

    server = ApiServer(handler, body_seconds=BODY_SECONDS).start()
    try:
        yield server, seen
    finally:
        server.stop()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# A request the server refuses before any handler runs (its request line is malformed): sent on
# a connection after an answer, it is answered (a 400) if the server kept the connection open.
PROBE = b"GET /tasks HTTP/1.1 extra words\r\n\r\n"


def _exchange(port: int, raw: bytes, then: bytes = b"") -> tuple[http.client.HTTPResponse, Any, bool]:
    """Send ``raw`` (and ``then`` once the server has answered 100 Continue, if it does); the
    answer, its JSON body, and whether the server closed the connection after it.

    Closed or not is seen at once, not by waiting for the socket's timeout to pass quietly: a
    ``PROBE`` request follows the answer; a closed connection ends (or is reset) without an
    answer to it, an open one answers it with a 400 (and no handler sees it)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(raw)
        if then:
            assert sock.recv(1024).startswith(b"HTTP/1.1 100 "), "no 100 Continue"
            sock.sendall(then)
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = response.read()
        try:
            sock.sendall(PROBE)
            answer = b""
            while len(answer) < len(b"HTTP/1.1 400 ") and (more := sock.recv(64)):
                answer += more
            closed = not answer.startswith(b"HTTP/1.1 400 ")
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        return response, (json.loads(body) if body else None), closed
    finally:
        sock.close()


def _request(port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"\r\n" + body


def _host(port: int) -> dict[str, str]:
    return {"Host": f"127.0.0.1:{port}"}


@pytest.mark.parametrize("length", ["abc", "-1", "+5", "5.0", "0x10", "1e3", "\u0665", "9" * 21])
def test_a_malformed_content_length_is_a_400_naming_it_and_the_handler_never_runs(
    keyless: tuple[ApiServer, list[dict[str, Any]]], length: str
) -> None:
    server, seen = keyless
    port = _port(server.url)
    raw = _request(port, "POST", "/tasks", {**_host(port), "Content-Length": length}, b"{}")
    response, body, closed = _exchange(port, raw.decode("latin-1", errors="replace").encode("utf-8"))
    assert response.status == 400 and body["error"]["code"] == "invalid_content_length", body
    assert body["error"]["field"] == "Content-Length" and closed and seen == []


def test_two_different_content_lengths_are_a_400(keyless: tuple[ApiServer, list[dict[str, Any]]]) -> None:
    server, seen = keyless
    port = _port(server.url)
    raw = f"POST /tasks HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{{}}"
    response, body, closed = _exchange(port, raw.encode())
    assert response.status == 400 and body["error"]["field"] == "Content-Length" and closed and seen == []


def test_a_chunked_body_is_a_411_asking_for_content_length(
    keyless: tuple[ApiServer, list[dict[str, Any]]],
) -> None:
    server, seen = keyless
    port = _port(server.url)
    raw = _request(port, "POST", "/tasks", {**_host(port), "Transfer-Encoding": "chunked"}, b"2\r\n{}\r\n0\r\n\r\n")
    response, body, closed = _exchange(port, raw)
    assert response.status == 411 and body["error"]["code"] == "length_required" and closed and seen == []


@pytest.mark.parametrize("sent", [0, 1, 99])
def test_a_body_shorter_than_its_content_length_is_a_408_at_the_deadline_not_a_held_thread(
    keyless: tuple[ApiServer, list[dict[str, Any]]], sent: int
) -> None:
    server, seen = keyless
    port = _port(server.url)
    started = time.monotonic()
    raw = _request(port, "POST", "/tasks", {**_host(port), "Content-Length": "100"}, b"x" * sent)
    response, body, closed = _exchange(port, raw)
    took = time.monotonic() - started
    assert response.status == 408 and body["error"]["code"] == "request_timeout" and closed, body
    assert f"{sent} of the 100 bytes" in body["error"]["message"] and seen == []
    assert BODY_SECONDS <= took < 8, took  # answered at the deadline, long before the client gave up


def test_a_body_trickled_a_byte_at_a_time_gets_no_more_than_the_deadline(
    keyless: tuple[ApiServer, list[dict[str, Any]]],
) -> None:
    server, seen = keyless
    port = _port(server.url)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(_request(port, "POST", "/tasks", {**_host(port), "Content-Length": "1000"}))
        started = time.monotonic()
        sock.settimeout(BODY_SECONDS / 5)
        answer = b""
        while not answer and time.monotonic() - started < 8:
            try:
                sock.sendall(b"x")  # each byte within the socket's timeout: only a deadline stops it
                answer = sock.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        assert answer.startswith(b"HTTP/1.1 408 "), answer
    finally:
        sock.close()
    assert seen == []


def test_a_client_that_stops_sending_mid_body_gets_a_400(keyless: tuple[ApiServer, list[dict[str, Any]]]) -> None:
    server, seen = keyless
    port = _port(server.url)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(_request(port, "POST", "/tasks", {**_host(port), "Content-Length": "100"}, b"{}"))
        sock.shutdown(socket.SHUT_WR)  # the body ends at 2 bytes
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = json.loads(response.read())
    finally:
        sock.close()
    assert response.status == 400 and body["error"]["code"] == "incomplete_body" and seen == []


def test_a_whole_body_reaches_the_handler(keyless: tuple[ApiServer, list[dict[str, Any]]]) -> None:
    server, seen = keyless
    port = _port(server.url)
    payload = json.dumps({"goal": "g" * 70_000}).encode()  # more than one read of the socket
    headers = {**_host(port), "Content-Length": str(len(payload)), "Content-Type": "application/json"}
    response, body, closed = _exchange(port, _request(port, "POST", "/tasks", headers, payload))
    assert response.status == 200 and body == {"ok": True} and not closed
    assert [e["body"] for e in seen] == [payload.decode()]


def test_expect_100_continue_is_answered_only_for_a_body_the_server_will_take(
    keyless: tuple[ApiServer, list[dict[str, Any]]],
) -> None:
    server, seen = keyless
    port = _port(server.url)
    headers = {**_host(port), "Content-Length": "2", "Expect": "100-continue"}
    response, body, _ = _exchange(port, _request(port, "POST", "/tasks", headers), then=b"{}")
    assert response.status == 200 and [e["body"] for e in seen] == ["{}"]
    too_big = {**_host(port), "Content-Length": str(MAX_BODY_BYTES + 1), "Expect": "100-continue"}
    response, body, closed = _exchange(port, _request(port, "POST", "/tasks", too_big))
    assert response.status == 413 and body["error"]["code"] == "body_too_large" and closed and len(seen) == 1


@pytest.mark.parametrize(
    "host",
    ["evil.example:{port}", "localhost.evil.example:{port}", "127.0.0.1:{other}", "localhost:{other}", "", None,
     "127.0.0.1:{port}\u0665", "127.0.0.1:{port}:{port}"],
)  # fmt: skip
def test_the_keyless_server_refuses_a_host_that_is_not_its_own_with_a_421(
    keyless: tuple[ApiServer, list[dict[str, Any]]], host: str | None
) -> None:
    server, seen = keyless
    port = _port(server.url)
    headers = {} if host is None else {"Host": host.format(port=port, other=port + 1)}
    body_bytes = b'{"goal": "rebound"}'
    headers |= {"Content-Type": "application/json", "Content-Length": str(len(body_bytes))}
    raw = _request(port, "POST", "/tasks", headers, body_bytes)
    response, body, closed = _exchange(port, raw.decode("latin-1").encode("utf-8"))
    assert response.status == 421 and body["error"] == {
        "code": "misdirected_request",
        "message": body["error"]["message"],
        "field": "Host",
    }
    assert closed and seen == []


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LOCALHOST:{port}", "localhost"]
)
def test_the_keyless_server_answers_its_own_names(keyless: tuple[ApiServer, list[dict[str, Any]]], host: str) -> None:
    server, seen = keyless
    port = _port(server.url)
    response, _body, _ = _exchange(port, _request(port, "GET", "/tasks", {"Host": host.format(port=port)}))
    assert response.status == 200 and len(seen) == 1


def test_a_request_line_over_64_kib_is_a_json_414(keyless: tuple[ApiServer, list[dict[str, Any]]]) -> None:
    server, _ = keyless
    port = _port(server.url)
    raw = f"GET /tasks?x={'a' * 70_000} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    response, body, closed = _exchange(port, raw)
    assert response.status == 414 and response.getheader("Content-Type") == "application/json"
    assert body["error"]["code"] == "uri_too_long" and closed


@pytest.mark.parametrize(
    "headers", [{f"X-H{i}": "v" for i in range(101)}, {"X-Long": "v" * 70_000}], ids=["101 headers", "a 70 kB header"]
)
def test_too_many_or_too_long_headers_are_a_json_431(
    keyless: tuple[ApiServer, list[dict[str, Any]]], headers: dict[str, str]
) -> None:
    server, _ = keyless
    port = _port(server.url)
    response, body, closed = _exchange(port, _request(port, "GET", "/tasks", {**_host(port), **headers}))
    assert response.status == 431 and response.getheader("Content-Type") == "application/json"
    assert body["error"]["code"] == "headers_too_large" and closed


def test_a_malformed_request_line_is_a_json_400(keyless: tuple[ApiServer, list[dict[str, Any]]]) -> None:
    server, _ = keyless
    port = _port(server.url)
    response, body, _ = _exchange(port, b"GET /tasks HTTP/1.1 extra words\r\n\r\n")
    assert response.status == 400 and body["error"]["code"] == "bad_request"


@pytest.mark.parametrize("length", [str(MAX_BODY_BYTES + 1), str(10**12)])
def test_an_announced_body_over_the_limit_is_a_401_without_a_key_and_a_413_with_one(
    api_stack: ApiStack, length: str
) -> None:
    port = _port(api_stack.url)
    headers = {**_host(port), "Content-Type": "application/json", "Content-Length": length}
    response, body, closed = _exchange(port, _request(port, "POST", "/tasks", headers))  # no body follows
    assert response.status == 401 and body["error"]["code"] == "unauthorized" and closed
    assert response.getheader("WWW-Authenticate") == "Bearer"
    headers["Authorization"] = f"Bearer {api_stack.key}"
    response, body, closed = _exchange(port, _request(port, "POST", "/tasks", headers))
    assert response.status == 413 and body["error"]["code"] == "body_too_large" and closed


def test_a_refused_key_is_a_401_before_the_body_is_read(api_stack: ApiStack) -> None:
    port = _port(api_stack.url)
    headers = {**_host(port), "Content-Type": "application/json", "Content-Length": "100",
               "Authorization": "Bearer aq_" + "x" * 43}  # fmt: skip
    started = time.monotonic()
    response, _body, closed = _exchange(port, _request(port, "POST", "/tasks", headers))  # the body never comes
    assert response.status == 401 and _body["error"]["code"] == "unauthorized" and closed
    assert time.monotonic() - started < 5
