"""The sweeper and tasks parked over a running limit (queueing/sweeper.py, storage/running_slots.py):
a parked task is silent by design and is never re-sent, however long it waits; a queued task
whose wake was lost (its WAIT item taken, its message never sent) is still swept; and room no
release made (the deployment's default limit raised on redeploy, or its fleet capacity) wakes as
many waiters as it holds. The engine runs on the in-memory twin; the tier queues are real SQS on moto server."""

from __future__ import annotations

from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch import Dispatcher
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.queueing.sweeper import sweep
from agentq.runtime import build_dispatcher, build_queues
from agentq.storage import fleet_slots, keys
from agentq.storage.container import Storage
from agentq.storage.running_slots import WAIT
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, scripted

STORAGE = "memory"
STALE_AFTER = 60.0


@pytest.fixture(scope="module")
def queues(moto_server: MotoServer) -> TaskQueues:
    return build_queues(deployment(moto_server))


def _dispatcher(
    store: Storage, queues: TaskQueues, registry: Any, limit: int | None = None, fleet_capacity: int | None = None
) -> Dispatcher:
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))
    return build_dispatcher(engine, store, queues, max_receive_count=5, default_max_running=limit,
                      fleet_capacity=fleet_capacity)  # fmt: skip


def _sent(queues: TaskQueues) -> list[str]:
    """The task ids of the messages in the normal queue (read and deleted)."""
    got = queues.sqs.receive_message(QueueUrl=queues.url("normal"), MaxNumberOfMessages=10, WaitTimeSeconds=0)
    for m in got.get("Messages", []):
        queues.delete("normal", m["ReceiptHandle"])
    return [TaskMessage.model_validate_json(m["Body"]).task_id for m in got.get("Messages", [])]


def _mid_run(store: Storage, dispatcher: Dispatcher, tenant: str) -> Task:
    """A task of ``tenant`` admitted and claimed by another worker: running, holding its slots."""
    running = store.tasks.create(scripted([{"text": "done"}]), tenant=tenant)
    assert dispatcher.fair.admit(running, "normal").waits is None
    assert store.tasks.claim(running.task_id, "other-worker", 30) is not None
    return running


def _one_running_and_parked(
    store: Storage, queues: TaskQueues, registry: Any, tenant: str, waiting: int
) -> tuple[Dispatcher, Task, list[Task]]:
    """A dispatcher whose default limit is 1, the normal queue emptied, one task of ``tenant``
    mid-run (its one slot taken) and ``waiting`` more parked behind it."""
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    _sent(queues)
    running = _mid_run(store, dispatcher, tenant)
    parked = [store.tasks.create(scripted([{"text": "done"}]), tenant=tenant) for _ in range(waiting)]
    for task in parked:
        action = dispatcher.handle(TaskMessage(task_id=task.task_id).model_dump_json(), tier="normal", receive_count=1)
        assert "waits queued" in action.reason
    return dispatcher, running, parked


def _long_after(store: Storage, tasks: list[Task]) -> float:
    return max(store.tasks.get(t.task_id).updated_at or 0.0 for t in tasks) + 10 * STALE_AFTER


def test_the_sweeper_leaves_a_task_parked_for_a_slot_alone_however_long_it_has_waited(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher, running, parked = _one_running_and_parked(store, queues, registry, "patient", waiting=3)
    later = _long_after(store, [running, *parked])
    for n in (1, 2):  # pass after pass
        report = sweep(store, queues, stale_after=STALE_AFTER, now=later + n, default_max_running=1)
        assert not {t.task_id for t in parked} & set(report.swept)
        assert report.parked == 3 and report.woken == []
        assert not {t.task_id for t in parked} & set(_sent(queues))
    # their order is kept: the release wakes the oldest
    store.tasks.transition(running.task_id, TaskStatus.SUCCEEDED)
    dispatcher.fair.release(running.task_id)
    assert _sent(queues) == [parked[0].task_id]


def test_a_queued_task_whose_wake_was_lost_after_its_wait_item_was_taken_is_still_swept(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    _, running, [lost, kept] = _one_running_and_parked(store, queues, registry, "crashed-waker", waiting=2)
    # a waker took the first waiter's item and died before sending its message
    pk = keys.tenant_pk("crashed-waker")
    [item] = [i for i in store.slots.table.query(pk, prefix=WAIT) if i["task_id"] == lost.task_id]
    store.slots.table.delete({"pk": pk, "sk": item["sk"]})
    report = sweep(store, queues, stale_after=STALE_AFTER, now=_long_after(store, [running, lost, kept]),
                   default_max_running=1)  # fmt: skip
    assert lost.task_id in report.swept and kept.task_id not in report.swept
    assert lost.task_id in _sent(queues)


def test_raising_the_deployments_default_limit_lets_the_sweeper_wake_as_many_waiters_as_it_made_room_for(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    _, running, parked = _one_running_and_parked(store, queues, registry, "redeployed", waiting=3)
    now = (store.tasks.get(parked[-1].task_id).updated_at or 0.0) + 1  # too soon to sweep anyone
    report = sweep(store, queues, stale_after=STALE_AFTER, now=now, default_max_running=1)
    assert report.woken == [] and _sent(queues) == []  # no room: nobody woken
    report = sweep(store, queues, stale_after=STALE_AFTER, now=now, default_max_running=3)  # redeployed with 3
    assert report.woken == [parked[0].task_id, parked[1].task_id]  # oldest first, two slots made
    assert sorted(_sent(queues)) == sorted(report.woken) and report.swept == []
    redeployed = _dispatcher(store, queues, registry, limit=3)
    for task_id in report.woken:
        redeployed.handle(TaskMessage(task_id=task_id).model_dump_json(), tier="normal", receive_count=1)
        assert store.tasks.get(task_id).status is TaskStatus.SUCCEEDED
    assert store.tasks.get(parked[2].task_id).status is TaskStatus.QUEUED
    assert store.tasks.get(running.task_id).status is TaskStatus.RUNNING  # untouched by the sweep


def test_a_task_waiting_for_the_fleet_is_left_alone_and_a_raised_capacity_wakes_as_many_as_it_made_room_for(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, fleet_capacity=1)
    _sent(queues)
    _mid_run(store, dispatcher, "fleet-full")
    parked = [store.tasks.create(scripted([{"text": "done"}]), tenant=t) for t in ("fleet-full", "other")]
    for task in parked:
        action = dispatcher.handle(TaskMessage(task_id=task.task_id).model_dump_json(), tier="normal", receive_count=1)
        assert "the fleet is full" in action.reason
    later = max(store.tasks.get(t.task_id).updated_at or 0.0 for t in parked) + STALE_AFTER + 1
    report = sweep(store, queues, stale_after=STALE_AFTER, now=later, fleet_capacity=1)
    assert report.parked == 2 and report.swept == [] and report.woken == [] and _sent(queues) == []
    report = sweep(store, queues, stale_after=STALE_AFTER, now=later, fleet_capacity=2)  # redeployed with 2
    assert report.woken == [parked[1].task_id]  # one slot made; "other" runs none, "fleet-full" one
    assert _sent(queues) == report.woken and report.swept == []


def test_a_fleet_waiter_whose_tenants_waiting_mark_was_lost_is_woken_by_the_next_sweep(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    """Capacity 1: A runs, B waits for the fleet, and B's tenant's waiting mark is lost (a crash
    between ``park``'s two writes, or in a wake's ``_drop_mark``). A's end wakes nobody, since
    the wake finds waiting tenants by their marks; the sweep marks B's tenant again and wakes it."""
    dispatcher = _dispatcher(store, queues, registry, fleet_capacity=1)
    _sent(queues)
    a = _mid_run(store, dispatcher, "fleet-a")
    b = store.tasks.create(scripted([{"text": "done"}]), tenant="fleet-b")
    assert "the fleet is full" in (dispatcher.fair.admit(b, "normal").waits or "")
    slots = dispatcher.fair.slots
    store.table.delete({"pk": fleet_slots.waiting_pk(slots.fleet_name), "sk": fleet_slots.WAITING_TENANT + "fleet-b"})
    store.tasks.transition(a.task_id, TaskStatus.SUCCEEDED)
    assert dispatcher.fair.release(a.task_id)  # the fleet slot frees...
    assert _sent(queues) == []  # ...and wakes nobody: the mark is gone
    now = (store.tasks.get(b.task_id).updated_at or 0.0) + 1
    report = sweep(store, queues, stale_after=STALE_AFTER, now=now, fleet_capacity=1)
    assert report.woken == [b.task_id] and report.swept == []
    assert _sent(queues) == [b.task_id]
