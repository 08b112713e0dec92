"""A cut never leaves part of a credential: wherever a tool's text is cut to a length (the
registry's result and error caps, ``http_fetch``'s ``max_bytes``), the text is redacted whole
first (ARCHITECTURE 15). The model chooses what comes before a value (a path an API echoes, a
padding, ``max_bytes`` itself), so each test puts the cut at every position across the value,
from before its first character to after its last (at every byte of it in UTF-16 and UTF-32
bodies, where a character is two to four bytes), and reads the committed steps.

Real parts: the vault, a tool's credential client and ``http_fetch`` sending to the echo server
of tests/vault_support.py, run by the engine."""

from __future__ import annotations

from typing import Any

import pytest

from agentq.core.models import TaskStatus, ToolOutcome
from agentq.core.tools import ToolContext, tool
from agentq.core.tools._core import MAX_ERROR_CHARS, MAX_RESULT_CHARS
from agentq.core.tools.fetch import LONGEST_SPELLING, READ_PAST, redacted_cut
from agentq.core.vault import MAX_VALUE_BYTES, Credential
from agentq.core.vault_crypto import EnvelopeCipher
from agentq.observe.redaction import MIN_CHARS, REDACTED, REDACTOR, spellings
from agentq.storage.container import Storage, memory_storage

from tests.helpers import scripted
from tests.test_vault import _engine, _marker, _put, _results, _use
from tests.test_vault import cipher as cipher  # the fixtures
from tests.test_vault import echo as echo
from tests.vault_support import EchoServer


def _echo(url: str, ctx: ToolContext) -> str:
    return str(ctx.credential("github").get(url).body.decode())


@tool
def echo_after(url: str, pad: int, ctx: ToolContext) -> str:
    """Returns ``pad`` dots, then what an echoing API answered to the user's github credential."""
    return "." * pad + _echo(url, ctx)


@tool
def echo_decoded(url: str, max_bytes: int, ctx: ToolContext) -> str:
    """What an echoing API answered to the user's github credential, read to ``max_bytes`` and
    decoded by the charset its answer names."""
    response = ctx.credential("github").get(url, max_bytes=max_bytes)
    return str(response.body.decode(response.charset, errors="replace"))


@tool
def echo_raises_after(url: str, pad: int, ctx: ToolContext) -> str:
    """Raises with ``pad`` dots, then what an echoing API answered to the user's github credential."""
    raise RuntimeError("." * pad + _echo(url, ctx))


def leaked(content: str, value: str) -> list[str]:
    """What ``content`` holds of ``value``: its start (the marker's fixed ``MRK``), or any run of
    ``MIN_CHARS`` characters of any of its spellings."""
    pieces = {s[i : i + MIN_CHARS] for s in spellings(value) for i in range(len(s) - MIN_CHARS + 1)}
    return [p for p in pieces | {value[:3]} if p in content]


def _run(store: Storage, cipher: EnvelopeCipher, echo: EchoServer, calls: list[dict[str, Any]]) -> list[ToolOutcome]:
    names = sorted({c["name"] for c in calls})
    sub = scripted([{"text": "", "tool_calls": calls}, {"text": "done"}], tools=names)
    task = store.tasks.create(sub.model_copy(update={"user": "ann"}), tenant="t")
    assert (
        _engine(store, cipher, echo, echo_after, echo_raises_after, echo_decoded).run(task.task_id).status
        is TaskStatus.SUCCEEDED
    )
    return _results(store, task.task_id)


def _where(store: Storage, cipher: EnvelopeCipher, echo: EchoServer, call: dict[str, Any], after: str = "") -> int:
    """Where the value starts in what ``call`` returns (all of it redacted; ASCII: bytes are characters)."""
    [probe] = _run(store, cipher, echo, [call])
    return probe.content.index(REDACTED) - len(after)


def _credential(store: Storage, cipher: EnvelopeCipher, echo: EchoServer, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AGENTQ_HTTP_FETCH_ALLOW", echo.host)  # the client's SSRF guard: loopback only here
    marker = _marker()
    _put(store, cipher, "github", marker, [echo.host], user="ann")
    return marker


def test_the_registrys_result_cap_at_every_position_across_a_credential_leaves_none_of_it(
    cipher: EnvelopeCipher, echo: EchoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = memory_storage()
    marker = _credential(store, cipher, echo, monkeypatch)
    start = _where(store, cipher, echo, _use("echo_after", url=echo.url("/me"), pad=0))
    # pad so that k characters of the value come before the cut, k from -1 to len + 1
    cuts = range(-1, len(marker) + 2)
    calls = [_use("echo_after", url=echo.url("/me"), pad=MAX_RESULT_CHARS - start - k) for k in cuts]
    results = _run(store, cipher, echo, calls)
    assert len(results) == len(cuts)
    for k, result in zip(cuts, results, strict=True):
        assert not result.is_error and "[result truncated:" in result.content, k
        assert leaked(result.content, marker) == [], (k, result.content[-80:])


def test_the_registrys_error_cap_at_every_position_across_a_credential_leaves_none_of_it(
    cipher: EnvelopeCipher, echo: EchoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = memory_storage()
    marker = _credential(store, cipher, echo, monkeypatch)
    prefix = "ToolError: RuntimeError: "
    start = _where(store, cipher, echo, _use("echo_raises_after", url=echo.url("/me"), pad=0), prefix)
    cuts = range(-1, len(marker) + 2)
    calls = [_use("echo_raises_after", url=echo.url("/me"), pad=MAX_ERROR_CHARS - start - k) for k in cuts]
    results = _run(store, cipher, echo, calls)
    assert len(results) == len(cuts)
    for k, result in zip(cuts, results, strict=True):
        assert result.is_error and result.content.startswith(prefix) and result.content.endswith("..."), k
        assert leaked(result.content, marker) == [], (k, result.content[-80:])


def test_http_fetch_cut_at_every_max_bytes_across_a_credential_leaves_none_of_it(
    cipher: EnvelopeCipher, echo: EchoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = memory_storage()
    marker = _credential(store, cipher, echo, monkeypatch)
    headers = {"Authorization": "Bearer ${vault:github}"}
    [probe] = _run(store, cipher, echo, [_use("http_fetch", url=echo.url("/me"), headers=headers)])
    status, body = probe.content.split("\n\n", 1)
    start = body.index(REDACTED)  # ASCII: the bytes before the value are its characters
    cuts = range(-1, len(marker) + 2)
    calls = [_use("http_fetch", url=echo.url("/me"), headers=headers, max_bytes=start + k) for k in cuts]
    results = _run(store, cipher, echo, calls)
    assert len(results) == len(cuts)
    for k, result in zip(cuts, results, strict=True):
        assert not result.is_error and result.content.startswith(status), k
        assert result.content.endswith(f"\n[truncated at {start + k} bytes]"), k
        assert leaked(result.content, marker) == [], (k, result.content[-80:])
        assert f"\n\n{body[: start + k]}\n[truncated" in result.content, k  # the redacted body, cut


@pytest.mark.parametrize("kind", ["bearer", "basic"])
def test_the_longest_spelling_of_a_credential_is_within_what_http_fetch_reads_past_its_cut(kind: str) -> None:
    """fetch reads READ_PAST bytes past max_bytes, so whatever the cut leaves is redacted: no
    spelling of the largest value and username the vault takes (control characters and characters
    of four bytes, the costliest to escape) is longer in UTF-8 than LONGEST_SPELLING, nor longer
    in UTF-16 or UTF-32 than READ_PAST."""
    for char in ("\x01", "\U0001f600", "%", "é"):
        secret = (char * MAX_VALUE_BYTES).encode()[:MAX_VALUE_BYTES].decode(errors="ignore")
        user = char * 256 if kind == "basic" else None
        credential = Credential("c", kind, (), secret, username=user)  # type: ignore[arg-type]
        forms = [s for form in credential.secret_forms() for s in spellings(form)]
        assert max(len(s.encode()) for s in forms) <= LONGEST_SPELLING, (kind, repr(char))
        for encoding in ("utf-16-le", "utf-32-le"):
            assert max(len(s.encode(encoding)) for s in forms) <= READ_PAST, (kind, repr(char), encoding)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16-le", "utf-32-be"])
def test_http_fetchs_read_ending_anywhere_in_a_credential_leaves_none_of_it(encoding: str) -> None:
    """The read itself stops (max_bytes + READ_PAST) in a long body of values, a line each:
    wherever in a value it stops, and however much the redactions before it shortened the text,
    what is shown holds nothing of that value, and shows the values before the read's last
    LONGEST_READ bytes, redacted. In UTF-16 and UTF-32 it stops at every byte of the value's
    first and last two characters (a character cut in two among them): each stop is a redaction
    of the whole read in every encoding, which the UTF-8 case, stopping at every byte, makes cheap."""
    value = _marker()
    REDACTOR.add(value)
    one, line = value.encode(encoding), "\n".encode(encoding)
    wide = len(one) // len(value)
    copies = READ_PAST // len(one + line) + 4
    stops = range(len(one) + 1) if wide == 1 else [*range(2 * wide), *range(len(one) - 2 * wide, len(one) + 1)]
    for stop in stops:
        read = (one + line) * copies + one[:stop]
        for max_bytes in (1, len(read) // 2, len(read)) if wide == 1 else (len(read),):
            shown, cut = redacted_cut(read, max_bytes, more=True)
            text = shown.decode(encoding, errors="replace")
            assert cut and leaked(text, value) == [], (stop, max_bytes, text[-60:])
            if max_bytes == len(read):
                assert REDACTED in text and set(text.split("\n")) <= {REDACTED, ""}, (stop, text[-60:])


HEADERS = {"Authorization": "Bearer ${vault:github}"}
PAD = 600  # CJK characters before the echo: 1,200 bytes of UTF-16 with no NUL, so http_fetch shows it
WIDE = [  # the echo's encoding, the charset its Content-Type names, a byte order mark first, the tool reading it
    ("utf-16-le", "utf-16le", False, "http_fetch"),
    ("utf-16-be", "utf-16be", False, "http_fetch"),
    ("utf-16-le", "utf-16", True, "http_fetch"),
    ("utf-16-be", "utf-16", True, "http_fetch"),
    ("utf-16-be", "utf-16be", False, "echo_decoded"),
    ("utf-32-le", "utf-32le", False, "echo_decoded"),
    ("utf-32-be", "utf-32be", False, "echo_decoded"),
    ("utf-32-be", "utf-32", True, "echo_decoded"),
]


@pytest.mark.parametrize(("encoding", "charset", "bom", "reader"), WIDE)
def test_a_cut_at_every_byte_across_a_credential_in_a_utf16_or_utf32_body_leaves_none_of_it(
    cipher: EnvelopeCipher,
    echo: EchoServer,
    monkeypatch: pytest.MonkeyPatch,
    encoding: str,
    charset: str,
    bom: bool,
    reader: str,
) -> None:
    """``max_bytes`` counts bytes, and a character of UTF-16 is two of them (or four), of UTF-32
    four: with the cut at every byte from before the value to after it, what is shown is the whole
    body redacted, then cut, decoded as the tool decodes it. UTF-32 is read by a tool's client:
    ``http_fetch`` shows a body with a NUL in its first KB as binary, which every UTF-32 body is."""
    store = memory_storage()
    marker = _credential(store, cipher, echo, monkeypatch)
    url = echo.url(f"/me?encoding={encoding}&charset={charset}&pad={PAD}" + ("&bom=1" if bom else ""))

    def call(max_bytes: int) -> dict[str, Any]:
        if reader == "http_fetch":
            return _use("http_fetch", url=url, headers=HEADERS, max_bytes=max_bytes)
        return _use("echo_decoded", url=url, max_bytes=max_bytes)

    [probe] = _run(store, cipher, echo, [call(1_000_000)])
    body = probe.content.split("\n\n", 1)[1] if reader == "http_fetch" else probe.content
    assert marker not in body and REDACTED in body and body.startswith("\u4e01" * PAD), probe.content[:200]
    sent = ("\ufeff" if bom else "").encode(encoding) + body.encode(encoding)  # the body redacted, as bytes
    start = len(sent) - len(body[body.index(REDACTED) :].encode(encoding))  # where the value starts
    cuts = range(start - 1, start + len(marker.encode(encoding)) + 2)
    calls = [call(cut) for cut in cuts]
    results = [r for at in range(0, len(calls), 40) for r in _run(store, cipher, echo, calls[at : at + 40])]
    assert len(results) == len(cuts)  # 40 calls a turn: the scripted model's turn stays under its output cap
    for cut, result in zip(cuts, results, strict=True):
        assert not result.is_error, (cut, result.content[-200:])
        assert leaked(result.content, marker) == [], (cut, result.content[-80:])
        shown = sent[:cut].decode(charset, errors="replace")  # the whole body redacted, then cut
        if reader == "http_fetch":
            assert result.content.endswith(f"\n\n{shown}\n[truncated at {cut} bytes]"), (cut, result.content[-80:])
        else:
            assert result.content == shown, (cut, result.content[-80:])


def test_a_utf16_echo_in_a_body_that_names_no_charset_holds_none_of_the_credential(
    cipher: EnvelopeCipher, echo: EchoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read as UTF-8 (the body names no charset), a UTF-16 echo is the value with a NUL after
    each character, which no spelling matches in the text: it is found in the bytes, whatever
    charset the body names."""
    store = memory_storage()
    marker = _credential(store, cipher, echo, monkeypatch)
    for encoding in ("utf-16-le", "utf-16-be"):
        url = echo.url(f"/me?encoding={encoding}&bom=1&pad={PAD}")
        [result] = _run(store, cipher, echo, [_use("http_fetch", url=url, headers=HEADERS)])
        assert not result.is_error and "\x00" in result.content, result.content[:200]
        assert leaked(result.content.replace("\x00", ""), marker) == [], result.content[-400:]
