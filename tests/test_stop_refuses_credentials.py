"""A run's use of a credential is also its check that its task still runs under its lease
(``core.engine._credentials``, ``storage.vault.Vault.get_running``): once a stop has marked the
task (or it was cancelled, or another worker took it), the egress proxy adds no credential to
its requests: ``403`` naming why, before any contact with the host, and the run is told
(``LeaseState.lose``), which kills its sandbox (tests/test_sandbox_halt.py).

Real parts: the proxy on its Unix socket, an echo server on loopback, the store on the moto server
(its DynamoDB calls counted as botocore sends them)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.control import vault as control_vault
from agentq.core.engine import LeaseState
from agentq.core.engine._credentials import TaskCredentials
from agentq.core.errors import LeaseLost
from agentq.core.models import Lease, TaskStatus
from agentq.core.tools.egress import EgressProxy
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.core.vault import CredentialWrite
from agentq.core.vault_crypto import EnvelopeCipher, LocalDataKeys
from agentq.storage.container import Storage

from tests.helpers import dynamo, scripted
from tests.vault_support import EchoServer, echo_server

SCOPE = "user 'ann'"


class Queues:
    def send(self, *_: Any, **__: Any) -> None:
        pass


class CallLog:
    """The DynamoDB operations the store's client sends (botocore's before-call event)."""

    def __init__(self, store: Storage) -> None:
        self.ops: list[str] = []
        dynamo(store).client.meta.events.register("before-call.dynamodb.*", self._seen)

    def _seen(self, model: Any, **_: Any) -> None:
        self.ops.append(model.name)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with echo_server() as server:
        yield server


@pytest.fixture
def cipher(tmp_path: Path) -> EnvelopeCipher:
    return EnvelopeCipher(LocalDataKeys.from_file(tmp_path / "vault.key"))


def _running(store: Storage) -> Lease:
    task = store.tasks.create(scripted([{"text": "x"}]).model_copy(update={"user": "ann"}), tenant="t")
    got = store.tasks.claim(task.task_id, "w1", 600)
    assert got is not None
    return got[0]


@contextlib.contextmanager
def _proxy(store: Storage, cipher: EnvelopeCipher, echo: EchoServer, held: LeaseState) -> Iterator[EgressProxy]:
    """A task's proxy to the echo with the run's credentials; both closed after (the run's values
    leave the redactor's hold, as at a run's end)."""
    credentials = TaskCredentials(store.vault, cipher, "t", "ann", held)
    rule = HostRule.parse(echo.host)
    proxy = EgressProxy([rule], FetchPolicy(allow=(rule,)), credentials=credentials)
    try:
        yield proxy
    finally:
        proxy.close()
        credentials.close()


def _get(proxy: EgressProxy, echo: EchoServer, path: str) -> bytes:
    """What a process in the sandbox gets for a plain GET of ``path`` through the proxy."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(proxy.path)
        sock.sendall(f"GET {echo.url(path)} HTTP/1.1\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _put(store: Storage, cipher: EnvelopeCipher, echo: EchoServer, marker: str, user: str | None) -> None:
    write = CredentialWrite.model_validate({"value": marker, "hosts": [echo.host], "user": user})
    control_vault.put(store, Queues(), cipher, "t", "github", write)  # type: ignore[arg-type]


@pytest.mark.parametrize(("owner", "calls"), [("ann", ["BatchGetItem"]), (None, ["BatchGetItem", "GetItem"])])
def test_a_credentialed_request_reads_its_tasks_meta_in_the_round_trip_that_reads_the_credential(
    store: Storage, cipher: EnvelopeCipher, echo: EchoServer, owner: str | None, calls: list[str]
) -> None:
    """The user's credential: one BatchGetItem (its item and META), where it was one GetItem;
    the tenant's (the user has none of that name): the same, then the tenant's item, where it
    was two GetItems. No round trip more than before; one item more a use (META)."""
    marker = f"MRK{time.time_ns()}Z"
    _put(store, cipher, echo, marker, owner)
    held = LeaseState(_running(store))
    with _proxy(store, cipher, echo, held) as proxy:
        assert _status(_get(proxy, echo, "/headers")) == 200  # the run's first: its listing is read too
        log = CallLog(store)
        for n in range(3):
            assert _status(_get(proxy, echo, f"/headers?n={n}")) == 200
        assert log.ops == calls * 3
        assert [r["authorization"] for r in echo.requests] == [f"Bearer {marker}"] * 4


def _mark(store: Storage, lease: Lease) -> str:
    assert store.tasks.mark_stopping([lease.task_id], SCOPE) == [True]
    return f"is being stopped ({SCOPE})"


def _cancel(store: Storage, lease: Lease) -> str:
    store.tasks.transition(lease.task_id, TaskStatus.CANCELLED, error={"code": "cancelled", "message": "stopped"})
    return "is cancelled"


def _take_over(store: Storage, lease: Lease) -> str:
    store.tasks.release(lease)
    assert store.tasks.claim(lease.task_id, "w2", 600) is not None
    return f"lease epoch {lease.epoch} of task {lease.task_id} superseded"


@pytest.mark.parametrize("ending", [_mark, _cancel, _take_over], ids=["stop's mark", "cancel", "takeover"])
def test_once_its_task_no_longer_runs_under_the_lease_a_credentialed_request_is_refused_before_any_contact(
    store: Storage, cipher: EnvelopeCipher, echo: EchoServer, ending: Callable[[Storage, Lease], str]
) -> None:
    marker = f"MRK{time.time_ns()}Z"
    _put(store, cipher, echo, marker, "ann")
    lease = _running(store)
    held = LeaseState(lease)
    with _proxy(store, cipher, echo, held) as proxy:
        assert _status(_get(proxy, echo, "/headers")) == 200
        why = ending(store, lease)
        log = CallLog(store)
        refused = _get(proxy, echo, "/headers?after")
        assert _status(refused) == 403, refused
        assert why.encode() in refused and b"no credential added" in refused and b"nothing sent" in refused, refused
        assert log.ops == ["BatchGetItem"]
        assert [r["path"] for r in echo.requests] == ["/headers"]  # the refused one never reached the host
        assert held.lost.is_set()  # the run is told: its sandbox is killed, its next check ends it
        with pytest.raises(LeaseLost, match=why.split(" (")[0]) as told:
            held.check()
        details: dict[Callable[[Storage, Lease], str], dict[str, Any]] = {
            _mark: {"stopping": SCOPE},
            _cancel: {"status": TaskStatus.CANCELLED},
            _take_over: {},
        }
        assert told.value.details == details[ending]  # the run ends as a fenced write would end it
        again = _get(proxy, echo, "/headers?again")
        assert _status(again) == 403 and log.ops == ["BatchGetItem"]  # known now: nothing read
        assert marker.encode() not in refused + again
