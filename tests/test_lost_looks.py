"""A task waiting on a remote agent's task wakes itself with a delayed look queued after its park
commits; a worker that dies between the two leaves it with nothing to wake it. Its park records
when the look is due (``core.status.LOOK_DUE``), so the sweeper sends a lost look once it is
overdue, every other move clears the mark, and a look that arrives while the next one is not due
yet is a stray, deleted without a claim (two looks never go on as two chains). Against moto
server; the whole path with a real remote and real workers: tests/test_a2a_client.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus
from agentq.core.status import LOOK_DUE
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.queueing.sweeper import sweep
from agentq.runtime import build_dispatcher, build_queues, build_registry, build_store
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, scripted

STALE = 60.0


def _world(moto_server: MotoServer) -> tuple[Any, TaskQueues, Any]:
    settings = deployment(moto_server)
    store, queues = build_store(settings), build_queues(settings)
    engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
    return store, queues, build_dispatcher(engine, store, queues, max_receive_count=5)


def _parked(store: Any, *, look_due: float | None, priority: str = "normal") -> str:
    """A task moved running -> waiting as a park does: with its look's due time, or without (children)."""
    task = store.tasks.create(scripted([{"text": "done"}]).model_copy(update={"priority": priority}), tenant="t")
    store.tasks.transition(task.task_id, TaskStatus.RUNNING)
    store.tasks.transition(task.task_id, TaskStatus.WAITING, extra={LOOK_DUE: look_due} if look_due else None)
    return str(task.task_id)


def _received(queues: TaskQueues, tier: str) -> list[TaskMessage]:
    got = queues.sqs.receive_message(QueueUrl=queues.url(tier), WaitTimeSeconds=1, MaxNumberOfMessages=10)
    return [TaskMessage.model_validate_json(m["Body"]) for m in got.get("Messages", [])]


@pytest.mark.parametrize("priority", ["high", "normal", "low"])
def test_a_remote_wait_whose_look_was_lost_is_sent_one_once_overdue_on_its_own_tier(
    moto_server: MotoServer, priority: str
) -> None:
    store, queues, _ = _world(moto_server)
    due = time.time()
    lost = _parked(store, look_due=due, priority=priority)
    children = _parked(store, look_due=None, priority=priority)  # woken by its fan-out, never by a look
    assert lost not in sweep(store, queues, stale_after=STALE, now=due + STALE - 1).looked  # maybe only late
    report = sweep(store, queues, stale_after=STALE, now=due + STALE + 1)
    assert lost in report.looked and children not in report.looked + report.swept
    assert [(m.task_id, m.kind) for m in _received(queues, priority) if m.task_id in (lost, children)] == [
        (lost, "remote_poll")
    ]
    assert children not in sweep(store, queues, stale_after=STALE, now=due + 100 * STALE).looked


def test_every_move_but_the_park_that_queues_a_look_clears_its_due_time(moto_server: MotoServer) -> None:
    store, queues, _ = _world(moto_server)
    due = time.time()
    task_id = _parked(store, look_due=due)
    assert store.tasks.get(task_id).look_due == pytest.approx(due)
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # the look woke it
    assert store.tasks.get(task_id).look_due is None
    store.tasks.transition(task_id, TaskStatus.RUNNING)
    store.tasks.transition(task_id, TaskStatus.WAITING)  # now waiting on children: no look of its own
    assert store.tasks.get(task_id).look_due is None
    assert task_id not in sweep(store, queues, stale_after=STALE, now=due + 100 * STALE).looked


def test_a_look_that_arrives_before_the_next_one_is_due_is_deleted_without_a_claim(moto_server: MotoServer) -> None:
    store, _, dispatcher = _world(moto_server)
    for ahead in (600, 29):  # a look arriving right after a park whose next look is the shortest, 30 s, away
        stray = _parked(store, look_due=time.time() + ahead)
        _assert_dropped(store, dispatcher, stray)
    due = _parked(store, look_due=time.time() - 1)  # its look, on time: it runs
    dispatcher.handle(TaskMessage(task_id=due, kind="remote_poll").model_dump_json(), tier="normal", receive_count=1)
    assert store.tasks.get(due).claim_count == 1


def _assert_dropped(store: Any, dispatcher: Any, stray: str) -> None:
    before = store.tasks.get(stray)
    action = dispatcher.handle(TaskMessage(task_id=stray, kind="remote_poll").model_dump_json(), tier="normal",
                               receive_count=1)  # fmt: skip
    assert (action.kind, action.reason) == ("delete", "a stray look: the task's next look is due later")
    after = store.tasks.get(stray)
    assert (after.status, after.claim_count, after.lease_epoch) == (TaskStatus.WAITING, before.claim_count,
                                                                    before.lease_epoch)  # fmt: skip
