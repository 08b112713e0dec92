"""A cut never leaves part of a credential: wherever a tool's text is cut to a length (the
registry's result and error caps, ``http_fetch``'s ``max_bytes``), the text is redacted whole
first (ARCHITECTURE 15). The model chooses what comes before a value (a path an API echoes, a
padding, ``max_bytes`` itself), so each test puts the cut at every position across the value,
from before its first character to after its last, and reads the committed steps.

Real parts: the vault, a tool's credential client and ``http_fetch`` sending to the echo server
of tests/vault_support.py, run by the engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.core.models import TaskStatus, ToolOutcome
from agentq.core.tools import ToolContext, tool
from agentq.core.tools._core import MAX_ERROR_CHARS, MAX_RESULT_CHARS
from agentq.core.vault_crypto import EnvelopeCipher, LocalDataKeys
from agentq.observe.redaction import MIN_CHARS, REDACTED, spellings
from agentq.storage.container import Storage, memory_storage

from tests.helpers import scripted
from tests.test_vault import _engine, _marker, _put, _results, _use
from tests.vault_support import EchoServer, echo_server


@pytest.fixture
def cipher(tmp_path: Path) -> EnvelopeCipher:
    return EnvelopeCipher(LocalDataKeys.from_file(tmp_path / "vault.key"))


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with echo_server() as server:
        yield server


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
