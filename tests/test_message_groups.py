"""Every message agentq sends for a task carries its tenant as ``MessageGroupId`` (SQS fair
queues group by it: a quiet tenant's messages are served ahead of a noisy one's backlog), not
only the first: a renewal, a continuation, the follow-ups a run asks for (a batch poll, an
approval's timer, a lapsed hold's release), a sweep, a wake. moto keeps ``MessageGroupId`` on a
standard queue, so a receive asking for it shows the group each message was sent with. The
engine runs on the in-memory twin; the tier queues are real SQS on moto server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig, RunResult
from agentq.core.models import TaskStatus
from agentq.queueing.dispatch import Dispatcher
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.queueing.sweeper import sweep
from agentq.runtime import build_dispatcher, build_queues
from agentq.storage.container import Storage
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, scripted

STORAGE = "memory"
TENANT = "grouped"


@pytest.fixture(scope="module")
def queues(moto_server: MotoServer) -> TaskQueues:
    return build_queues(deployment(moto_server))


def _dispatcher(store: Storage, queues: TaskQueues, registry: Any, limit: int | None = None) -> Dispatcher:
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))
    return build_dispatcher(engine, store, queues, max_receive_count=5, default_max_running=limit)


def _groups(queues: TaskQueues, expect: int = 0) -> list[tuple[str, str, str | None]]:
    """(task id, kind, MessageGroupId) of the messages in the normal queue (read and deleted):
    all those visible now, waiting out delays until ``expect`` have come."""
    found: list[tuple[str, str, str | None]] = []
    while True:
        got = queues.sqs.receive_message(
            QueueUrl=queues.url("normal"), MaxNumberOfMessages=10, WaitTimeSeconds=2 if len(found) < expect else 0,
            MessageSystemAttributeNames=["MessageGroupId"],
        ).get("Messages", [])  # fmt: skip
        if not got:
            return found
        for m in got:
            message = TaskMessage.model_validate_json(m["Body"])
            found.append((message.task_id, message.kind, m.get("Attributes", {}).get("MessageGroupId")))
            queues.delete("normal", m["ReceiptHandle"])


def _handle(dispatcher: Dispatcher, task_id: str, receive_count: int = 1, **kwargs: Any) -> Any:
    body = TaskMessage(task_id=task_id).model_dump_json()
    return dispatcher.handle(body, tier="normal", receive_count=receive_count, **kwargs)


def test_a_renewed_message_and_a_continuation_keep_their_tasks_group(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry)
    _groups(queues)
    renewed = store.tasks.create(scripted([{"text": "done"}]), tenant=TENANT)
    assert _handle(dispatcher, renewed.task_id, receive_count=6).reason.startswith("renewed")
    continued = store.tasks.create(scripted([{"text": "a"}, {"text": "b"}]), tenant=TENANT)
    stopping = threading.Event()
    stopping.set()  # a worker shutting down: the run ends at its first boundary and continues later
    assert "continuation sent" in _handle(dispatcher, continued.task_id, stop=stopping).reason
    sent = _groups(queues, expect=2)
    assert {(t, g) for t, _, g in sent} == {(renewed.task_id, TENANT), (continued.task_id, TENANT)}
    assert ("continue" in {k for _, k, _ in sent}) and len(sent) == 2


def test_the_follow_ups_a_run_asks_for_carry_its_tasks_group(
    store: Storage, queues: TaskQueues, registry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher = _dispatcher(store, queues, registry)
    _groups(queues)
    task = store.tasks.create(scripted([{"text": "done"}]), tenant=TENANT)
    now = time.time()
    # The engine's answer for a run that paused on an approval with a timer, waits on a batch and
    # ended with a lapsed hold in flight: what the dispatcher sends after it is the subject.
    ran = RunResult(
        task.task_id, "waiting", status=TaskStatus.WAITING, approval_due=now + 1, batch_poll=1, lapsed_until=now + 1
    )  # fmt: skip (each comes back in a second)
    monkeypatch.setattr(dispatcher.engine, "run", lambda *_, **__: ran)
    _handle(dispatcher, task.task_id)
    sent = _groups(queues, expect=3)
    assert sorted(k for _, k, _ in sent) == ["approval_due", "batch_poll", "release_holds"]
    assert {g for _, _, g in sent} == {TENANT}


def test_a_swept_task_and_a_woken_waiter_carry_their_tasks_group(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    _groups(queues)
    running = store.tasks.create(scripted([{"text": "done"}]), tenant=TENANT)
    assert dispatcher.fair.admit(running, "normal").waits is None
    waiter = store.tasks.create(scripted([{"text": "done"}]), tenant=TENANT)
    assert "waits queued" in _handle(dispatcher, waiter.task_id).reason
    stranded = store.tasks.create(scripted([{"text": "done"}]), tenant="other-" + TENANT)  # never sent
    later = (store.tasks.get(stranded.task_id).updated_at or 0.0) + 3600
    assert stranded.task_id in sweep(store, queues, stale_after=60, now=later, default_max_running=1).swept
    store.tasks.transition(running.task_id, TaskStatus.CANCELLED)
    dispatcher.fair.release(running.task_id)
    sent = {(t, g) for t, _, g in _groups(queues, expect=2)}
    assert (stranded.task_id, "other-" + TENANT) in sent and (waiter.task_id, TENANT) in sent
