"""What the egress proxy (``core.tools.egress``) hands back for a plain request it added a
credential to: the upstream's answer, read whole as its head frames it, with every spelling of
the value(s) it added redacted (``observe.redaction.Values``: as bytes, and as UTF-16 and UTF-32
of either byte order from any byte on) before the process gets a byte of it. Each mark is as
long as what it replaces (``redact_same_length``), so a format that counts its bytes around an
echo (git's pkt-lines: a server refusing a clone quotes the header in an ``ERR`` line) still
reads, and git prints the server's reason.

A server may echo the request's headers (a debugging endpoint, an error page quoting the
request): passed on raw, the echo would put the credential in the sandboxed process's hands, and
that process is model-written code, which can reverse, re-encode or split the value before it
prints it, so no redactor of what it writes could recognise it. So nothing of such an answer
passes unredacted: its status line, its header lines and its body, read to the end its head
frames (``Content-Length``; ``chunked``, chunk extensions and trailer fields dropped; or until
the upstream closes), are redacted and sent with a ``Content-Length`` of their own and
``Connection: close``. An interim ``1xx`` head is sent on, redacted, as it comes.

What cannot be redacted is refused with a ``502`` naming why, and no byte of its body passed
(``AnswerRefused``): a body in a ``Content-Encoding`` (the proxy asks for ``identity``; a
server that compresses anyway would hide the value from the redactor), a transfer coding other
than ``chunked``, a body over ``MAX_ANSWER`` bytes (the proxy holds it whole, in a worker other
tenants' runs share), a head over ``MAX_ANSWER_HEAD``, a ``206`` (a range of an answer can hold
a piece of a value no spelling matches: the proxy drops ``Range`` too), a ``101``, broken framing,
or an answer that ended before the end its head framed. A refusal's words quote nothing of the
answer, which may be an echo.

Holding the answer whole is what lets it be redacted and re-framed at once; its cost is bounded:
``MAX_ANSWER`` bytes per connection, one answer redacted at a time per proxy (the CPU: about
50 ms a MB of text, about 0.5 s a MB of bytes with NULs, read as UTF-16 and UTF-32 too), and an
answer that streams (server-sent events) reaches the process only when it ends.
"""

from __future__ import annotations

import re

from agentq.core import vault
from agentq.core.tools.egress_request import BadBody, BadRequest, Body, framing
from agentq.observe.redaction import Values

MAX_ANSWER = 8 * 1024 * 1024  # body bytes held for redaction, per answer
MAX_ANSWER_HEAD = 64 * 1024
_STATUS = re.compile(rb"(HTTP/1\.[01]) ([0-9]{3})(?: [^\r\n]*)?")
_CODING = re.compile(rb"[a-z0-9.+-]{1,20}")  # a coding named in a refusal; any other is not quoted
# Header lines of the upstream's answer the proxy does not send on: the hop's own (it frames the
# body itself, and the connection ends with the answer).
_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"content-length", b"trailer", b"upgrade"}
)
# What an injected request loses besides the proxy's ``DROPPED_HEADERS``: each asks the server to
# transform its answer (compress it, send a piece of it, recode it) past what the redactor reads.
# The one list ``http_fetch`` and a tool's client drop too (``core.vault.TRANSFORMING_HEADERS``).
TRANSFORMING_HEADERS = frozenset(name.encode() for name in vault.TRANSFORMING_HEADERS)
ASK_IDENTITY = b"Accept-Encoding: identity"


class AnswerRefused(Exception):
    """The answer cannot be handed back redacted: the client gets a ``502`` naming why instead,
    and no byte of the answer's body."""


class Answer:
    """The upstream's answer to one credentialed request. ``feed`` takes its bytes as they come
    (and returns what may go to the client at once: an interim head, redacted), ``done`` says
    its framed end is read, ``end`` that the upstream closed, and ``redacted`` is what the
    client gets: the whole answer, redacted, re-framed; or ``AnswerRefused``."""

    def __init__(self, values: Values, method: str) -> None:
        self.values = values
        self.no_body = method.upper() == "HEAD"  # or a 204 or 304: set with the head
        self.pending = b""  # a head not yet whole
        self.head: list[bytes] | None = None  # the final head's lines
        self.body: Body | None = None  # how its body is framed; None: it ends when the upstream closes
        self.data: list[bytes] = []
        self.size = 0
        self.ended = False

    @property
    def done(self) -> bool:
        return self.head is not None and self.body is not None and self.body.done

    def end(self) -> None:
        self.ended = True

    def feed(self, chunk: bytes) -> bytes:
        now: list[bytes] = []
        while chunk and self.head is None:
            self.pending += chunk
            cut = self.pending.find(b"\r\n\r\n")
            if cut < 0 or cut > MAX_ANSWER_HEAD:
                if len(self.pending) > MAX_ANSWER_HEAD:
                    raise AnswerRefused(f"an answer head over {MAX_ANSWER_HEAD // 1024} KB")
                return b"".join(now)
            lines, chunk, self.pending = self.pending[:cut].split(b"\r\n"), self.pending[cut + 4 :], b""
            version, status = _status(lines[0])
            if 100 <= status < 200:
                if status == 101:
                    raise AnswerRefused("a 101: the connection would switch to a protocol the proxy cannot redact")
                now.append(self.values.redact_same_length(b"\r\n".join(lines) + b"\r\n\r\n"))  # 100 Continue...
                continue
            self._frame(lines, version, status)
        if chunk and self.head is not None:
            self._take(chunk)
        return b"".join(now)

    def _frame(self, lines: list[bytes], version: str, status: int) -> None:
        if status == 206:
            raise AnswerRefused("a 206: a range of an answer may hold a piece of the credential no redaction finds")
        self.no_body = self.no_body or status in (204, 304)
        self.head = lines
        if self.no_body:
            self.body = Body(0)
            return
        named = [(h.partition(b":")[0].strip().lower(), h.partition(b":")[2].strip(b" \t")) for h in lines[1:]]
        codings = [c.strip().lower() for n, v in named if n == b"content-encoding" for c in v.split(b",")]
        if any(c not in (b"", b"identity") for c in codings):
            which = ", ".join(c.decode() if _CODING.fullmatch(c) else "an unknown one" for c in codings if c)
            raise AnswerRefused(
                f"an answer in Content-Encoding {which}: the proxy asked for identity and redacts no encoded body"
            )
        if not any(n in (b"content-length", b"transfer-encoding") for n, _ in named):
            return  # the body ends when the upstream closes
        try:
            self.body = framing(lines[1:], version)[1]
        except BadRequest:  # its words quote the answer's header: not passed on
            raise AnswerRefused(
                "an answer framed two ways, or by a Content-Length or Transfer-Encoding the proxy cannot read"
            ) from None
        self.body.framed = False
        if not self.body.chunked and self.body.left > MAX_ANSWER:
            raise AnswerRefused(f"an answer of {self.body.left} bytes, over the {MAX_ANSWER} bytes the proxy redacts")

    def _take(self, chunk: bytes) -> None:
        if self.body is not None:
            try:
                chunk = self.body.feed(chunk)  # what follows the framed end is dropped
            except BadBody:  # its words quote the body: not passed on
                raise AnswerRefused("an answer whose chunked framing is broken") from None
        self.size += len(chunk)
        if self.size > MAX_ANSWER:
            raise AnswerRefused(f"an answer over the {MAX_ANSWER} bytes the proxy redacts")
        self.data.append(chunk)

    def redacted(self) -> bytes:
        """The answer to send: its head and body redacted, framed by a fresh ``Content-Length``."""
        if self.head is None:
            raise AnswerRefused("the upstream sent no whole answer head")
        if not self.done and not (self.body is None and self.ended):
            raise AnswerRefused("the upstream's answer stopped before the end its head framed")
        body = self.values.redact_same_length(b"".join(self.data))
        kept = [h for h in self.head[1:] if h.partition(b":")[0].strip().lower() not in _HOP]
        if self.no_body:  # a HEAD's, 204's or 304's length is the resource's: kept as sent
            kept += [h for h in self.head[1:] if h.partition(b":")[0].strip().lower() == b"content-length"]
        else:
            kept.append(b"Content-Length: %d" % len(body))
        head = b"\r\n".join([self.head[0], *kept, b"Connection: close"]) + b"\r\n\r\n"
        return self.values.redact_same_length(head) + body


def _status(line: bytes) -> tuple[str, int]:
    match = _STATUS.fullmatch(line)
    if match is None:  # the line is not quoted: it may be an echo
        raise AnswerRefused("an answer that does not start with an HTTP/1.x status line")
    return match[1].decode(), int(match[2])
