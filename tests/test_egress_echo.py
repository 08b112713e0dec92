"""An upstream that echoes the credential the egress proxy added (core/tools/egress.py,
core/tools/egress_answer.py): the sandboxed process is model-written code, which could reverse or
re-encode what it reads before printing it, so no spelling of the value may reach it at all.
Real sockets: the real proxy on its Unix socket, a real server on loopback that answers each
request with a function of the ``Authorization`` header it got, the client reading every byte
the proxy sends until it closes. Each assertion: the upstream got the value, and no spelling of
it (``observe.redaction.spellings``, in UTF-8, UTF-16 and UTF-32 of either byte order) is in
what the client got. A request without a credential, and its answer, pass byte for byte."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import gzip
import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from agentq.core.tools.egress import EgressProxy
from agentq.core.tools.egress_answer import MAX_ANSWER
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.core.vault import Credential, HostBinding
from agentq.observe.redaction import REDACTED, spellings

SAFETY = 10.0
SECRET = f"MRK/{uuid.uuid4().hex}+Z"  # a "/" and a "+": its percent and JSON spellings differ from it
CODECS = ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")
GET = "GET http://{host}/echo HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n"
ADDED = (b"authorization:", b"x-api-key:")  # the header each kind of credential is added as
Reply = Callable[[bytes], list[bytes]]  # the Authorization header's value -> what is sent, piece by piece


class Upstream:
    """A loopback HTTP server: each connection's request head is noted, and ``reply`` of the
    value of its credential's header (``Authorization``, or the api key's) sent, each piece with its own ``sendall``; then the connection is
    closed, unless ``linger`` (it waits for the proxy to close it)."""

    def __init__(self, reply: Reply, *, linger: bool = False) -> None:
        self.reply, self.linger = reply, linger
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.heads: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(SAFETY)
            data = b""
            while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                data += chunk
            head = data.partition(b"\r\n\r\n")[0]
            self.heads.append(head)
            auth = [h.partition(b":")[2].strip() for h in head.split(b"\r\n") if h.lower().startswith(ADDED)]
            for piece in self.reply(auth[0] if auth else b""):
                conn.sendall(piece)
            if self.linger:
                while conn.recv(65536):
                    pass


class OneCredential:
    """A task's credentials as the proxy reads them (``CredentialSource``): one, for its host."""

    def __init__(self, credential: Credential) -> None:
        self.credential = credential

    def get(self, name: str, host: str | None = None, *, to: tuple[str, int] | None = None) -> Credential:
        raise AssertionError("the proxy reads credentials by host")

    def for_host(self, host: str, port: int) -> Credential | None:
        return self.credential if self.credential.allows(host, port) else None

    def bound_to(self, host: str, port: int) -> str | None:
        return self.credential.name if self.credential.allows(host, port) else None


@pytest.fixture(params=["bearer", "basic", "api_key"])
def credential(request: pytest.FixtureRequest) -> Credential:
    """Each kind: its header carries the secret as it is, or (basic) base64 of user:secret."""
    kind = request.param
    return Credential("api", kind, (), SECRET, username="ann" if kind == "basic" else None, header_name="X-Api-Key")


@pytest.fixture
def fetch() -> Iterator[Callable[..., tuple[bytes, Upstream, EgressProxy]]]:
    proxies: list[EgressProxy] = []

    def run(
        reply: Reply, credential: Credential | None, request: str = GET, *, linger: bool = False
    ) -> tuple[bytes, Upstream, EgressProxy]:
        """What the client gets for ``request`` (``{host}``: the upstream's) through a proxy that
        adds ``credential``, bound to the upstream, or none."""
        upstream = Upstream(reply, linger=linger)
        host = f"127.0.0.1:{upstream.port}"
        source = None
        if credential is not None:
            source = OneCredential(dataclasses.replace(credential, hosts=(HostBinding.parse(host),)))
        proxy = EgressProxy([HostRule.parse(host)], FetchPolicy(allow=(HostRule.parse(host),)), credentials=source)
        proxies.append(proxy)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(SAFETY)
            sock.connect(proxy.path)
            sock.sendall(request.format(host=host).encode())
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        upstream.sock.close()
        return answer, upstream, proxy

    yield run
    for proxy in proxies:
        proxy.close()


def leaks(credential: Credential, data: bytes) -> list[str]:
    """Every spelling of every text that carries the secret, in every encoding, found in ``data``."""
    return sorted(
        f"{codec}: {spelling!r}"
        for value in credential.secret_forms()
        for spelling in spellings(value)
        for codec in CODECS
        if spelling.encode(codec) in data
    )


def sent(credential: Credential, upstream: Upstream) -> None:
    """The upstream got the credential: there was something to echo."""
    assert len(upstream.heads) == 1 and credential.reference_value().encode() in upstream.heads[0]


def answer(status: bytes, body: bytes, *headers: bytes) -> list[bytes]:
    head = b"\r\n".join([b"HTTP/1.1 " + status, *headers, b"Content-Length: %d" % len(body)])
    return [head + b"\r\n\r\n" + body]


def chunked(body: bytes, size: int, trailer: bytes = b"") -> bytes:
    pieces = [b"%x;ext=1\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)]
    return b"".join(pieces) + b"0\r\n" + trailer + b"\r\n"


def echoed(auth: bytes) -> bytes:
    return b"you sent Authorization: " + auth + b"\n"


def chunked_echo(size: int, auth: bytes) -> list[bytes]:
    """The echo in chunks of ``size`` bytes (every byte of the value at a chunk's edge, for some
    size), each byte of the framing sent by a ``sendall`` of its own."""
    framed = chunked(echoed(auth), size)
    return [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", *[framed[i : i + 1] for i in range(len(framed))]]


def wide_echo(codec: str, shift: int, auth: bytes) -> list[bytes]:
    """The echo in UTF-16 or UTF-32, after ``shift`` bytes (any alignment in the body)."""
    return answer(
        b"200 OK", b"x" * shift + ("\ufeff" + echoed(auth).decode()).encode(codec), b"Content-Type: text/plain"
    )


def interim(auth: bytes) -> list[bytes]:
    return [b"HTTP/1.1 103 Early Hints\r\nX-Echo: " + auth + b"\r\n\r\n", *answer(b"200 OK", b"hello")]


def trailer(auth: bytes) -> list[bytes]:
    return [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        chunked(b"hello", 2, b"X-Echo: " + auth + b"\r\n"),
    ]


ECHOES: dict[str, Reply] = {
    "body": lambda auth: answer(b"200 OK", echoed(auth)),
    "body, the connection kept open": lambda auth: answer(b"200 OK", echoed(auth), b"Connection: keep-alive"),
    "json": lambda auth: answer(b"200 OK", json.dumps({"headers": {"Authorization": auth.decode()}}).encode()),
    "json, php's \\/": lambda auth: answer(b"200 OK", json.dumps(auth.decode()).replace("/", "\\/").encode()),
    "base64 of the header": lambda auth: answer(b"200 OK", base64.b64encode(b"Authorization: " + auth)),
    "until close": lambda auth: [b"HTTP/1.1 200 OK\r\n\r\n", echoed(auth)],
    "http/1.0 until close": lambda auth: [b"HTTP/1.0 200 OK\r\n\r\n", echoed(auth)],
    "a header": lambda auth: answer(b"200 OK", b"hello", b"X-Echo: " + auth, b"Www-Authenticate: " + auth),
    "the status reason": lambda auth: answer(b"401 " + auth, b"no"),
    "an interim head": interim,
    "a trailer": trailer,
    **{f"chunked by {size}": functools.partial(chunked_echo, size) for size in (1, 3, 7, 64)},
    **{
        f"{codec} at byte {shift}": functools.partial(wide_echo, codec, shift)
        for codec, width in (("utf-16-le", 2), ("utf-16-be", 2), ("utf-32-le", 4), ("utf-32-be", 4))
        for shift in range(width)
    },
}


@pytest.mark.parametrize("echo", ECHOES)
def test_no_spelling_of_an_added_credential_that_the_upstream_echoes_reaches_the_process(
    fetch: Callable[..., tuple[bytes, Upstream, EgressProxy]], credential: Credential, echo: str
) -> None:
    got, upstream, proxy = fetch(ECHOES[echo], credential, linger=echo.endswith("kept open"))
    sent(credential, upstream)
    assert leaks(credential, got) == []
    assert got.startswith((b"HTTP/1.1 200 OK\r\n", b"HTTP/1.0 200 OK\r\n", b"HTTP/1.1 401 ", b"HTTP/1.1 103 ")), got
    head, _, body = got.rpartition(b"\r\n\r\n") if echo == "an interim head" else got.partition(b"\r\n\r\n")
    assert f"Content-Length: {len(body)}\r\n".encode() in head + b"\r\n" and b"Connection: close" in head
    shown = [REDACTED.encode(codec) in got for codec in CODECS]
    assert any(shown) or (echo == "a trailer" and body == b"hello"), got  # redacted, not dropped
    original = b"".join(ECHOES[echo](credential.header()[1].encode())).rpartition(b"\r\n\r\n")[2]
    if not echo.startswith(("chunked", "a trailer")):  # one framed by its length or its end
        assert len(body) == len(original), (body, original)  # each mark as long as what it replaced
    assert proxy.injected == 1


def over_the_cap(framing: str, auth: bytes) -> list[bytes]:
    """An echo at both ends of a body one byte over the cap (by its length: only the head sent)."""
    body = echoed(auth) + b"." * (MAX_ANSWER + 1 - 2 * len(echoed(auth))) + echoed(auth)
    if framing == "length":
        return [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body), echoed(auth)]
    if framing == "chunked":
        return [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", chunked(body, 1 << 20)]
    return [b"HTTP/1.1 200 OK\r\n\r\n", body]


UNREDACTABLE: dict[str, tuple[Reply, bytes]] = {
    "gzip": (
        lambda auth: answer(b"200 OK", gzip.compress(echoed(auth)), b"Content-Encoding: gzip"),
        b"Content-Encoding gzip",
    ),
    "br": (lambda auth: answer(b"200 OK", b"\x1b" + echoed(auth), b"Content-Encoding: br"), b"Content-Encoding br"),
    **{
        f"over the cap, {framing}": (functools.partial(over_the_cap, framing), b"over the %d bytes" % MAX_ANSWER)
        for framing in ("length", "chunked", "until close")
    },
    "cut short": (
        lambda auth: [b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + echoed(auth)],
        b"stopped before the end its head framed",
    ),
    "a range": (lambda auth: answer(b"206 Partial Content", echoed(auth)[30:34]), b"a 206"),
    "a gzip transfer coding": (
        lambda auth: [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            chunked(gzip.compress(echoed(auth)), 5),
        ],
        b"framed two ways, or by a Content-Length or Transfer-Encoding the proxy cannot read",
    ),
    "no status line": (lambda auth: [b"ECHO " + auth + b"\r\n\r\n"], b"does not start with an HTTP/1.x status"),
}


@pytest.mark.parametrize("case", UNREDACTABLE)
def test_an_answer_the_proxy_cannot_redact_is_a_502_naming_why_and_none_of_its_body_passes(
    fetch: Callable[..., tuple[bytes, Upstream, EgressProxy]], credential: Credential, case: str
) -> None:
    reply, why = UNREDACTABLE[case]
    got, upstream, proxy = fetch(reply, credential)
    sent(credential, upstream)
    assert got.startswith(b"HTTP/1.1 502 Bad Gateway\r\n"), got[:300]
    assert why in got and len(got) < 1000, got[:1000]
    assert leaks(credential, got) == [] and b"\x1f\x8b" not in got and b"you sent" not in got
    assert any(why.decode() in r for r in proxy.refused)


def test_an_injected_request_asks_for_identity_and_for_no_range_or_recoding(
    fetch: Callable[..., tuple[bytes, Upstream, EgressProxy]], credential: Credential
) -> None:
    """The process's ``Accept-Encoding``, ``TE``, ``Range``, ``If-Range`` and ``Accept-Charset``
    would each ask the server for an answer the redactor cannot read whole: none is sent."""
    request = ("GET http://{host}/ HTTP/1.1\r\nAccept-Encoding: gzip, br\r\nTE: gzip\r\nRange: bytes=3-9\r\n"
               "If-Range: x\r\nAccept-Charset: utf-7\r\nX-Kept: 1\r\n\r\n")  # fmt: skip
    got, upstream, _ = fetch(lambda auth: answer(b"200 OK", b"ok"), credential, request)
    assert got.endswith(b"\r\n\r\nok")
    lines = upstream.heads[0].lower().split(b"\r\n")
    assert b"accept-encoding: identity" in lines and b"x-kept: 1" in lines
    assert not [h for h in lines if h.startswith((b"accept-encoding: g", b"te:", b"range:", b"if-range:", b"accept-c"))]


def test_a_header_the_proxy_cannot_encode_is_a_502_in_fixed_words_and_nothing_is_sent(
    fetch: Callable[..., tuple[bytes, Upstream, EgressProxy]],
) -> None:
    """The proxy encodes the credential's header line as HTTP/1.1 carries it, Latin-1: one that
    does not encode (a header name past Latin-1, which no write takes, read from the table as it
    is) raised in the connection's thread, a traceback naming the character and its offset on the
    worker's stderr, and the process got no answer. Now a 502 in words that quote none of it."""
    credential = Credential("api", "api_key", (), SECRET, header_name="X-Key-\u4e01")
    got, upstream, proxy = fetch(lambda auth: answer(b"200 OK", b"ok"), credential)
    assert got.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and b"'api'" in got and b"cannot carry" in got, got
    assert "\u4e01".encode() not in got and b"position" not in got and leaks(credential, got) == []
    assert all(head == b"" for head in upstream.heads) and proxy.injected == 0


PLAIN: list[Reply] = [
    lambda auth: answer(
        b"200 OK", b"Authorization: Bearer " + SECRET.encode() + bytes(range(256)), b"Connection: keep-alive"
    ),
    lambda auth: [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n",
        chunked(gzip.compress(b"x" * 1000), 7, b"X-T: 1\r\n"),
    ],
    lambda auth: [b"HTTP/1.0 206 Partial\r\nX: y\r\n\r\n", b"\x00\xff" * 5000],
]


@pytest.mark.parametrize("reply", PLAIN)
def test_an_answer_to_a_request_without_a_credential_passes_byte_for_byte(
    fetch: Callable[..., tuple[bytes, Upstream, EgressProxy]], reply: Reply
) -> None:
    got, upstream, proxy = fetch(reply, None)
    assert got == b"".join(reply(b"")) and proxy.injected == 0
    assert b"Accept-Encoding: gzip\r\n" in upstream.heads[0]  # the process's own, as it sent it


@pytest.mark.parametrize(
    ("method", "status"), [("HEAD", b"200 OK"), ("GET", b"204 No Content"), ("GET", b"304 Not Modified")]
)
def test_an_answer_with_no_body_is_handed_back_at_its_heads_end_redacted_with_its_length_as_sent(
    fetch: Callable[..., tuple[bytes, Upstream, EgressProxy]], credential: Credential, method: str, status: bytes
) -> None:
    """A HEAD's answer, a 204 and a 304 have no body, whatever their ``Content-Length`` says (the
    resource's): the proxy waits for none (the upstream keeps its connection open) and keeps it."""

    def reply(auth: bytes) -> list[bytes]:
        return [b"HTTP/1.1 " + status + b"\r\nX-Echo: " + auth + b"\r\nContent-Length: 1234\r\n\r\n"]

    got, upstream, _ = fetch(reply, credential, f"{method} http://{{host}}/ HTTP/1.1\r\n\r\n", linger=True)
    sent(credential, upstream)
    assert leaks(credential, got) == [] and got.startswith(b"HTTP/1.1 " + status + b"\r\n"), got
    assert got.endswith(b"\r\nContent-Length: 1234\r\nConnection: close\r\n\r\n") and REDACTED.encode() in got


def test_an_echo_in_a_format_that_counts_its_bytes_keeps_its_framing(
    fetch: Callable[..., tuple[bytes, Upstream, EgressProxy]], credential: Credential
) -> None:
    """Git's pkt-lines (four hex digits, the line's length): a server refusing a clone quotes the
    header in an ``ERR`` line, which git prints as the reason. Each redaction is as long as what
    it replaces, so every line still reads (seen failing with marks of their own length: git read
    a broken line and said only that it could not read from the remote)."""

    def pkt(text: bytes) -> bytes:
        return b"%04x" % (len(text) + 4) + text

    def refuse(auth: bytes) -> list[bytes]:
        body = (
            pkt(b"# service=git-upload-pack\n") + b"0000" + pkt(b"ERR invalid credentials: " + auth + b"\n") + b"0000"
        )
        return answer(b"200 OK", body, b"Content-Type: application/x-git-upload-pack-advertisement")

    got, upstream, _ = fetch(refuse, credential)
    sent(credential, upstream)
    body = got.partition(b"\r\n\r\n")[2]
    lines: list[bytes] = []
    while body:
        size = max(int(body[:4], 16), 4)  # 0000: a flush, four bytes
        assert len(body) >= size, (lines, body)
        lines.append(body[4:size])
        body = body[size:]
    assert lines[0] == b"# service=git-upload-pack\n" and lines[1] == lines[3] == b"" and len(lines) == 4, lines
    assert lines[2].startswith(b"ERR invalid credentials: ") and REDACTED.encode() in lines[2], lines
    assert leaks(credential, got) == []
