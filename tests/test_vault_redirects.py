"""A credential reaches only its bound hosts even when a bound host puts it in a redirect's URL.

A server that reflects a request header into its redirect (a login or OAuth-ish endpoint, or any
``?to=`` bounce) answers ``302 Location: http://elsewhere/landed?auth=<the token>``: the
credential was dropped from the next hop's headers, but followed, the URL itself would take it to
a host it is not bound to, in that host's request line (and, in its name, to a resolver). The
model's copy would be redacted, so the leak would be the only symptom. ``http_fetch`` and a tool's
credential client (``ctx.credential``) refuse such a redirect, however the server encoded the
value in it, before anything is sent to where it points (``core.tools.fetch.spells_a_value``).
The egress proxy follows no redirect: it redacts every header of a credentialed answer,
``Location`` among them (tests/test_egress_echo.py's echo in "a header")."""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.control import vault as control_vault
from agentq.core.engine import Engine
from agentq.core.engine._credentials import TaskCredentials
from agentq.core.models import ToolsStep
from agentq.core.tools import ToolRegistry
from agentq.core.tools.builtin import http_fetch_tool
from agentq.core.tools.credentials import CredentialHandle
from agentq.core.tools.fetch import FetchPolicy, FetchRefused, HostRule
from agentq.core.vault import CredentialWrite
from agentq.core.vault_crypto import EnvelopeCipher, LocalDataKeys
from agentq.storage.container import Storage, memory_storage

from tests.helpers import scripted
from tests.vault_support import ECHOES, EchoServer, echo_server

REFUSAL = "its Location holds the value of a credential or secret"


class Queues:
    def send(self, *_: object, **__: object) -> None: ...


@pytest.fixture
def servers() -> Iterator[tuple[EchoServer, EchoServer]]:
    """The credential's host, which reflects it into its redirects, and another host."""
    with echo_server() as bound, echo_server() as elsewhere:
        yield bound, elsewhere


def _vault(tmp_path: Path, bound: EchoServer) -> tuple[Storage, EnvelopeCipher, str]:
    store, marker = memory_storage(), "MRK" + uuid.uuid4().hex + "Z"
    cipher = EnvelopeCipher(LocalDataKeys.from_file(tmp_path / "vault.key"))
    write = CredentialWrite.model_validate({"value": marker, "hosts": [bound.host], "user": "ann"})
    control_vault.put(store, Queues(), cipher, "t", "github", write)  # type: ignore[arg-type]
    return store, cipher, marker


def _bounce(bound: EchoServer, elsewhere: EchoServer, how: str) -> str:
    return bound.url(f"/redirect?echo={how}&to=" + urllib.parse.quote(elsewhere.url("/landed"), safe=""))


@pytest.mark.parametrize("how", sorted(ECHOES))
def test_http_fetch_refuses_a_redirect_whose_location_holds_the_credential_and_sends_nothing_there(
    tmp_path: Path, servers: tuple[EchoServer, EchoServer], how: str
) -> None:
    """Before the fix the other host (allowed by the fetch policy, as any public host is, but
    not bound) got the token in its request line, in each of these encodings."""
    bound, elsewhere = servers
    store, cipher, marker = _vault(tmp_path, bound)
    headers = {"Authorization": "Bearer ${vault:github}"}
    fetch = {"name": "http_fetch", "input": {"url": _bounce(bound, elsewhere, how), "headers": headers}}
    policy = FetchPolicy(allow=(HostRule.parse(bound.host), HostRule.parse(elsewhere.host)))
    sub = scripted([{"text": "", "tool_calls": [fetch]}, {"text": "ok"}], tools=["http_fetch"])
    task = store.tasks.create(sub.model_copy(update={"user": "ann"}), tenant="t")
    Engine(store, worker_id="w", tools=ToolRegistry([http_fetch_tool(policy)]), cipher=cipher).run(task.task_id)
    assert bound.requests[0]["authorization"] == f"Bearer {marker}"
    assert elsewhere.requests == []  # not the token, not a request at all
    [result] = [r for s in store.steps.load(task.task_id) if isinstance(s.body, ToolsStep) for r in s.body.results]
    assert result.is_error and result.content.startswith("ToolError: FetchRefused: "), result.content
    assert f"refusing to follow a redirect from {bound.host}: {REFUSAL}" in result.content, result.content
    assert marker not in result.content


@pytest.mark.parametrize("how", ["query", "percent", "split"])
def test_a_tools_credential_client_refuses_a_redirect_whose_location_holds_its_credential(
    tmp_path: Path, servers: tuple[EchoServer, EchoServer], how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound, elsewhere = servers
    store, cipher, marker = _vault(tmp_path, bound)
    monkeypatch.setenv("AGENTQ_HTTP_FETCH_ALLOW", f"{bound.host},{elsewhere.host}")
    handle = CredentialHandle(TaskCredentials(store.vault, cipher, "t", "ann").get("github"))
    with pytest.raises(FetchRefused, match=REFUSAL) as refused:
        handle.get(_bounce(bound, elsewhere, how))
    assert bound.requests[0]["authorization"] == f"Bearer {marker}"
    assert elsewhere.requests == []
    assert marker not in str(refused.value)


def test_a_redirect_elsewhere_that_holds_no_credential_is_still_followed_without_it(
    tmp_path: Path, servers: tuple[EchoServer, EchoServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal is of an echo only: a bound API's redirect to a download host is followed."""
    bound, elsewhere = servers
    store, cipher, _ = _vault(tmp_path, bound)
    monkeypatch.setenv("AGENTQ_HTTP_FETCH_ALLOW", f"{bound.host},{elsewhere.host}")
    handle = CredentialHandle(TaskCredentials(store.vault, cipher, "t", "ann").get("github"))
    away = bound.url("/redirect?to=" + urllib.parse.quote(elsewhere.url("/landed?x=1"), safe=""))
    response = handle.get(away)
    assert response.status == 200 and response.redirects == [elsewhere.url("/landed?x=1")]
    assert [r["path"] for r in elsewhere.requests] == ["/landed?x=1"]
    assert "authorization" not in elsewhere.requests[0]
