"""The tier slot at the dispatcher (storage/tier_slots.py, queueing/fairness.py): a task refused
by its tenant's limit in its tier waits as a task refused by its tenant's limit waits (parked,
its message deleted: no retry, no receive counted towards the DLQ), and is told so; every ending
gives the tier slot back and wakes the next waiter (a run's end, a cancel while queued); the
sweeper leaves such a task alone and wakes the room a raised tier capacity made; a task that
runs on the workspace pool's hosts takes no tier slot. The engine runs on the in-memory twin;
the tier queues are real SQS on moto server."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agentq.api.task_view import activity
from agentq.control.operations import cancel
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch import Dispatcher
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.queueing.sweeper import sweep
from agentq.runtime import build_dispatcher, build_queues
from agentq.storage.container import Storage
from agentq.storage.tier_slots import tier_pk
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, scripted, tier_running

STORAGE = "memory"
STALE_AFTER = 60.0
LIMITS = {"normal": 1}  # a tier of 2: fair_limit(2)


@pytest.fixture(scope="module")
def queues(moto_server: MotoServer) -> TaskQueues:
    return build_queues(deployment(moto_server))


def _dispatcher(store: Storage, queues: TaskQueues, registry: Any, limits: dict[str, int] = LIMITS) -> Dispatcher:
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))
    return build_dispatcher(engine, store, queues, max_receive_count=5, tier_limits=limits)


def _sent(queues: TaskQueues) -> list[str]:
    """The task ids of the messages in the normal queue (read and deleted)."""
    got = queues.sqs.receive_message(QueueUrl=queues.url("normal"), MaxNumberOfMessages=10, WaitTimeSeconds=0)
    for m in got.get("Messages", []):
        queues.delete("normal", m["ReceiptHandle"])
    return [TaskMessage.model_validate_json(m["Body"]).task_id for m in got.get("Messages", [])]


def _deliver(dispatcher: Dispatcher, task: Task) -> Any:
    return dispatcher.handle(TaskMessage(task_id=task.task_id).model_dump_json(), tier="normal", receive_count=1)


def _holder_and_waiter(store: Storage, queues: TaskQueues, registry: Any, tenant: str) -> tuple[Dispatcher, Task, Task]:
    """``tenant``'s first task admitted (its tier slot taken, not claimed yet), its second delivered
    and refused by the tier: parked."""
    dispatcher = _dispatcher(store, queues, registry)
    _sent(queues)
    holder = store.tasks.create(scripted([{"text": "done"}]), tenant=tenant)
    assert dispatcher.fair.admit(holder, "normal").waits is None
    waiter = store.tasks.create(scripted([{"text": "done"}]), tenant=tenant)
    action = _deliver(dispatcher, waiter)
    assert (action.kind, action.reason) == (
        "delete",
        "over its tier's running (per tenant) limit of 1: waits queued for a slot",
    )
    return dispatcher, holder, waiter


def test_a_task_over_its_tier_limit_is_parked_its_message_deleted_and_told_what_it_waits_for(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    _, holder, waiter = _holder_and_waiter(store, queues, registry, "tier-parked")
    task = store.tasks.get(waiter.task_id)
    assert task.status is TaskStatus.QUEUED and not task.slots and task.claim_count == 0  # never ran
    assert store.slots.waits_on(task) == "tier"
    assert "waiting for a slot of the normal tier" in (activity(store, task, None, None) or "")  # type: ignore[arg-type]
    assert _sent(queues) == []  # deleted, not retried: nothing comes back until a slot frees
    assert tier_running(store, "tier-parked") == 1
    assert store.tasks.get(holder.task_id).slots == [
        tier_pk("tier-parked", "normal")
    ]  # an unlimited tenant: its tier's only


def test_a_run_that_ends_gives_its_tier_slot_back_and_wakes_the_tenants_next_task_of_the_tier(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher, holder, waiter = _holder_and_waiter(store, queues, registry, "tier-ends")
    _deliver(dispatcher, holder)  # runs to its end: the one place an ending gives its slots back
    assert store.tasks.get(holder.task_id).status is TaskStatus.SUCCEEDED
    assert _sent(queues) == [waiter.task_id]  # woken
    assert tier_running(store, "tier-ends") == 0
    _deliver(dispatcher, waiter)
    assert store.tasks.get(waiter.task_id).status is TaskStatus.SUCCEEDED and tier_running(store, "tier-ends") == 0


def test_a_task_cancelled_while_queued_and_admitted_gives_its_tier_slot_back_and_wakes_the_next(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher, holder, waiter = _holder_and_waiter(store, queues, registry, "tier-cancel")
    cancel(store, holder.task_id, queues=queues, slots=dispatcher.fair.slots)
    assert tier_running(store, "tier-cancel") == 0
    assert _sent(queues) == [waiter.task_id]


def test_the_sweeper_leaves_a_task_parked_by_its_tier_alone_and_wakes_the_room_a_raised_tier_capacity_made(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    _, holder, waiter = _holder_and_waiter(store, queues, registry, "tier-swept")
    later = (store.tasks.get(waiter.task_id).updated_at or 0.0) + 10 * STALE_AFTER
    report = sweep(store, queues, stale_after=STALE_AFTER, now=later, tier_limits=LIMITS)
    assert report.parked == 1 and waiter.task_id not in report.swept and report.woken == []
    assert report.swept == [holder.task_id]  # the holder, admitted and silent this long, is swept: not the waiter
    assert waiter.task_id not in _sent(queues)
    report = sweep(store, queues, stale_after=STALE_AFTER, now=later, tier_limits={"normal": 2})  # redeployed
    assert report.woken == [waiter.task_id] and waiter.task_id in _sent(queues)


def test_a_task_that_runs_on_the_workspace_pools_hosts_takes_no_tier_slot(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    pooled = dataclasses.replace(queues, workspace_pool="workspace")  # a deployment with the EC2 tier
    dispatcher = _dispatcher(store, pooled, registry)
    first = store.tasks.create(scripted([{"text": "done"}], tools=["shell"]), tenant="tier-pool")
    second = store.tasks.create(scripted([{"text": "done"}], tools=["shell"]), tenant="tier-pool")
    for task in (first, second):  # both admitted: the tier's invocations hold neither
        assert dispatcher.fair.admit(task, "normal").waits is None
    assert tier_running(store, "tier-pool") == 0
