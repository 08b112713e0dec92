"""A cut never leaves part of a credential: wherever a tool's text is cut to a length (the
registry's result and error caps, ``http_fetch``'s ``max_bytes``), the text is redacted whole
first (ARCHITECTURE 15). The model chooses what comes before a value (a path an API echoes, a
padding, ``max_bytes`` itself), so each test puts the cut at every position across the value,
from before its first character to after its last, and reads the committed steps.

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
    assert _engine(store, cipher, echo, echo_after, echo_raises_after).run(task.task_id).status is TaskStatus.SUCCEEDED
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
    """fetch reads LONGEST_SPELLING (and what it can become) past max_bytes, so whatever the
    cut leaves is redacted: no spelling of the largest value and username the vault takes (control
    characters and characters of four bytes, the costliest to escape) is longer."""
    for char in ("\x01", "\U0001f600", "%", "é"):
        secret = (char * MAX_VALUE_BYTES).encode()[:MAX_VALUE_BYTES].decode(errors="ignore")
        user = char * 256 if kind == "basic" else None
        credential = Credential("c", kind, (), secret, username=user)  # type: ignore[arg-type]
        longest = max(len(s.encode()) for form in credential.secret_forms() for s in spellings(form))
        assert longest <= LONGEST_SPELLING, (kind, repr(char), longest)


def test_http_fetchs_read_ending_anywhere_in_a_credential_leaves_none_of_it() -> None:
    """The read itself stops (max_bytes + READ_PAST) in a long body: wherever in a value it
    stops, and however much the redactions before it shortened the text, what is shown holds
    nothing of that value."""
    value = _marker()
    REDACTOR.add(value)
    copies = READ_PAST // len(value)  # each copy shrinks to REDACTED: the cut-off start is pulled forward
    for stop in range(len(value) + 1):
        read = (value * copies + value[:stop]).encode()
        for max_bytes in (1, len(read) // 2, len(read)):
            shown, cut = redacted_cut(read, max_bytes, more=True)
            assert cut and leaked(shown.decode(), value) == [], (stop, max_bytes, shown[-60:])
