"""A remote A2A agent that repeats the credential it was called with back, in its answer, its
error or its question, puts nothing of it in the task: every tool outcome is redacted when it is
made (``core.models.ToolOutcome``) and the remote's question before it becomes an approval
(ARCHITECTURE 15). Where the client cuts what the remote said (the task's text at
``MAX_TEXT``, an error's detail at 500 characters), the remote chooses what comes before the
value, so the cut is put at every position across it.

Real parts: the engine with the vault, the a2a-sdk client, and the a2a-sdk server of
tests/a2a_servers/desk.py (in a process of its own) echoing the ``Authorization`` header it
requires. Whatever the task left is read: every item of the table and every payload object."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import RemoteAgentRef, TaskStatus, ToolOutcome
from agentq.core.tools import ToolRegistry
from agentq.core.tools.a2a_remote import MAX_TEXT, untrusted
from agentq.core.vault_crypto import EnvelopeCipher, LocalDataKeys
from agentq.observe.redaction import REDACTED
from agentq.storage.container import Storage, memory_storage

from tests.helpers import scripted, wait_for
from tests.test_redaction_cuts import leaked
from tests.test_vault import _put, _results

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "TKN" + uuid.uuid4().hex + "Z"  # the desk's credential: TKN starts no other text here
ERROR = "InvalidParamsError: "  # how the client words the desk's refusal


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ledger = tmp_path_factory.mktemp("desk") / "received.jsonl"
    env = {**os.environ, "DESK_TOKEN": TOKEN, "DESK_LEDGER": str(ledger), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.a2a_servers.desk", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(up, timeout=30, what="the a2a-sdk desk server")
        yield port
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def world(desk: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Storage, Engine, dict[str, Any]]:
    monkeypatch.setenv("AGENTQ_A2A_ALLOW", f"127.0.0.1:{desk}")  # loopback, named
    store, cipher = memory_storage(), EnvelopeCipher(LocalDataKeys.from_file(tmp_path / "vault.key"))
    _put(store, cipher, "desk-token", TOKEN, [f"127.0.0.1:{desk}"], user="ann")
    engine = Engine(store, worker_id="w", tools=ToolRegistry(), config=EngineConfig(lease_seconds=10), cipher=cipher)
    ref = {"name": "desk", "card_url": f"http://127.0.0.1:{desk}/.well-known/agent-card.json",
           "host": f"127.0.0.1:{desk}", "credential": "desk-token"}  # fmt: skip
    return store, engine, ref


def _delegate(world: tuple[Storage, Engine, dict[str, Any]], messages: list[str]) -> tuple[str, TaskStatus | None]:
    """A task whose one turn sends each message to the desk; each remote task it waits on is looked
    at again at once (what a ``remote_poll`` does), until the task ends or pauses."""
    store, engine, ref = world
    calls = [{"name": "a2a__desk", "input": {"message": m}} for m in messages]
    sub = scripted([{"text": "", "tool_calls": calls}, {"text": "done"}], tools=["a2a__desk"])
    sub = sub.model_copy(update={"user": "ann", "remote_agents": [RemoteAgentRef.model_validate(ref)]})
    task_id = store.tasks.create(sub, tenant="t").task_id
    status = engine.run(task_id).status
    while status is TaskStatus.WAITING:
        store.tasks.transition(task_id, TaskStatus.QUEUED)
        status = engine.run(task_id).status
    return task_id, status


def _stored(store: Storage) -> str:
    """Everything the store holds: every item of the table, every payload object."""
    items = json.dumps(list(store.table._items.values()), default=str)  # type: ignore[attr-defined]
    return items + "".join(b.decode(errors="replace") for b in store.payloads.objects.values())  # type: ignore[attr-defined]


def _starts(results: list[ToolOutcome], offset: str) -> int:
    """Where the value starts in what the remote said, from a probe's redacted result."""
    [probe] = results
    return probe.content.index(REDACTED) - probe.content.index(offset) - len(offset)


def test_a_remote_agents_answer_echoing_its_credential_leaves_nothing_of_it_in_the_task(world: Any) -> None:
    store = world[0]
    task_id, status = _delegate(world, ["whoami:", "whoami-task:"])  # a message, then a task that completes
    assert status is TaskStatus.SUCCEEDED
    message, ended = _results(store, task_id)
    for result in (message, ended):
        assert not result.is_error and f"you sent Authorization: Bearer {REDACTED}" in result.content, result
    assert leaked(_stored(store), TOKEN) == []


def test_a_remote_agents_error_echoing_its_credential_leaves_nothing_of_it_in_the_task(world: Any) -> None:
    store = world[0]
    task_id, status = _delegate(world, ["refuse:"])
    assert status is TaskStatus.SUCCEEDED
    [result] = _results(store, task_id)
    assert result.is_error and f"Bearer {REDACTED}; a2a__desk was not run" in result.content, result
    assert leaked(_stored(store), TOKEN) == []


def test_a_remote_agents_question_echoing_its_credential_is_an_approval_that_holds_nothing_of_it(world: Any) -> None:
    store = world[0]
    task_id, status = _delegate(world, ["ask-whoami:"])
    assert status is TaskStatus.PAUSED
    [approval] = store.approvals.list(task_id)
    assert f"you sent Authorization: Bearer {REDACTED}" in approval.question, approval
    assert leaked(_stored(store), TOKEN) == []


def test_the_clients_error_detail_cut_at_every_position_across_an_echoed_credential_leaves_none_of_it(
    world: Any,
) -> None:
    store = world[0]
    start = _starts(_results(store, _delegate(world, ["refuse:"])[0]), ERROR)
    cuts = range(-1, len(TOKEN) + 2)
    task_id, status = _delegate(world, [f"refuse:{500 - len(ERROR) - start - k}" for k in cuts])
    assert status is TaskStatus.SUCCEEDED
    results = _results(store, task_id)
    assert len(results) == len(cuts) and all(r.is_error and ERROR in r.content for r in results)
    assert leaked(_stored(store), TOKEN) == []


def test_the_remote_tasks_text_cut_at_every_position_across_an_echoed_credential_leaves_none_of_it(
    world: Any,
) -> None:
    store, _, ref = world
    header = untrusted(RemoteAgentRef.model_validate(ref), "")
    start = _starts(_results(store, _delegate(world, ["whoami-task:"])[0]), header)
    cuts = range(-1, len(TOKEN) + 2)
    task_id, status = _delegate(world, [f"whoami-task:{MAX_TEXT - start - k}" for k in cuts])
    assert status is TaskStatus.SUCCEEDED
    results = _results(store, task_id)
    assert len(results) == len(cuts) and all(not r.is_error and r.content.startswith(header) for r in results)
    assert leaked(_stored(store), TOKEN) == []
