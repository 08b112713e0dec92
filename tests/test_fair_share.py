"""Per-tenant running limits and concurrency keys at the dispatcher (queueing/fairness.py): a
task over a limit waits ``queued`` with its message deleted, and the task that frees the slot
sends its message; a key's ``skip`` and ``cancel_running``. The engine runs on the in-memory
twin; the tier queues are real SQS on moto server (the wake is a message)."""

from __future__ import annotations

import math
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any

import pytest

from agentq.control.agents import create_agent
from agentq.control.defaults import Defaults
from agentq.control.operations import cancel
from agentq.control.submit import submit_once
from agentq.control.tenants import set_max_running
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import Concurrency, Task, TaskStatus, TaskSubmission
from agentq.queueing.dispatch import Dispatcher
from agentq.queueing.fairness import FairShare
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.queueing.sweeper import sweep
from agentq.runtime import build_dispatcher, build_queues
from agentq.storage import fleet_slots, keys
from agentq.storage.container import Storage
from agentq.storage.running_slots import Admission, RunningSlots, SlotUsage
from agentq.storage.table import TransactionConflict, Update
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, scripted

STORAGE = "memory"


@pytest.fixture(scope="module")
def queues(moto_server: MotoServer) -> TaskQueues:
    return build_queues(deployment(moto_server))


def _dispatcher(store: Storage, queues: TaskQueues, registry: Any, limit: int | None) -> Dispatcher:
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))
    return build_dispatcher(engine, store, queues, max_receive_count=5, default_max_running=limit)


def _submit(store: Storage, tenant: str, concurrency: dict[str, Any] | None = None, user: str | None = None) -> Task:
    submission = scripted([{"text": "done"}])
    if concurrency is not None:
        submission = TaskSubmission.model_validate({**submission.model_dump(), "concurrency": concurrency})
    if user is not None:
        submission = submission.model_copy(update={"user": user})
    return store.tasks.create(submission, tenant=tenant)


def _mid_run(dispatcher: Dispatcher, task: Task) -> None:
    """``task`` admitted and claimed, as by a worker in the middle of its run."""
    assert dispatcher.fair.admit(task, "normal").waits is None
    assert dispatcher.store.tasks.claim(task.task_id, "other-worker", 30) is not None


def _handle(dispatcher: Dispatcher, task_id: str) -> Any:
    return dispatcher.handle(TaskMessage(task_id=task_id).model_dump_json(), tier="normal", receive_count=1)


def _received(queues: TaskQueues) -> list[dict[str, Any]]:
    got = queues.sqs.receive_message(
        QueueUrl=queues.url("normal"), MaxNumberOfMessages=10, WaitTimeSeconds=0, MessageSystemAttributeNames=["All"]
    ).get("Messages", [])
    for m in got:
        queues.delete("normal", m["ReceiptHandle"])
    return list(got)


def _received_ids(queues: TaskQueues) -> list[str]:
    """The task ids of the messages in the normal queue (read and deleted), in the order read."""
    return [TaskMessage.model_validate_json(m["Body"]).task_id for m in _received(queues)]


def test_a_task_over_its_tenants_limit_waits_queued_without_its_message_and_runs_when_the_slot_frees(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    _received(queues)
    first, second = _submit(store, "acme"), _submit(store, "acme")
    _mid_run(dispatcher, first)

    parked = _handle(dispatcher, second.task_id)
    assert parked.kind == "delete" and "waits queued" in parked.reason  # no receive spent, no retry
    assert store.tasks.get(second.task_id).status is TaskStatus.QUEUED
    assert store.slots.usage("acme").waiting == 1 and _received(queues) == []

    store.tasks.transition(first.task_id, TaskStatus.SUCCEEDED)
    dispatcher.fair.release(first.task_id)
    (woken,) = _received(queues)
    assert TaskMessage.model_validate_json(woken["Body"]).task_id == second.task_id
    assert woken["Attributes"]["MessageGroupId"] == "acme"  # the fair queue's group: the tenant

    ran = _handle(dispatcher, second.task_id)
    assert ran.kind == "delete" and store.tasks.get(second.task_id).status is TaskStatus.SUCCEEDED
    assert store.slots.usage("acme").running == 0  # its slot came back when it ended


def test_another_tenant_is_not_held_by_a_tenant_at_its_limit(store: Storage, queues: TaskQueues, registry: Any) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    _mid_run(dispatcher, _submit(store, "noisy"))
    assert "waits queued" in _handle(dispatcher, _submit(store, "noisy").task_id).reason
    quiet = _submit(store, "quiet")
    assert _handle(dispatcher, quiet.task_id).kind == "delete"
    assert store.tasks.get(quiet.task_id).status is TaskStatus.SUCCEEDED


def test_a_tenant_without_a_limit_runs_without_slots(store: Storage, queues: TaskQueues, registry: Any) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=None)
    task = _submit(store, "free")
    assert _handle(dispatcher, task.task_id).kind == "delete"
    assert store.tasks.get(task.task_id).status is TaskStatus.SUCCEEDED
    assert store.slots.usage("free").running == 0 and not store.slots.holds_slots(task.task_id)


def test_a_key_at_its_limit_with_skip_ends_the_new_task_cancelled_and_leaves_the_running_one(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=None)
    key = {"key": "customer-42", "limit": 1, "on_conflict": "skip"}
    running, late = _submit(store, "shop", key), _submit(store, "shop", key)
    _mid_run(dispatcher, running)
    assert "skipped" in _handle(dispatcher, late.task_id).reason
    ended = store.tasks.get(late.task_id)
    assert ended.status is TaskStatus.CANCELLED and ended.error is not None
    assert ended.error["code"] == "concurrency_skipped"
    assert store.tasks.get(running.task_id).status is TaskStatus.RUNNING


def test_a_key_at_its_limit_with_cancel_running_cancels_the_holder_and_runs_once_it_stops(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=None)
    _received(queues)
    key = {"key": "customer-7", "limit": 1, "on_conflict": "cancel_running"}
    old, new = _submit(store, "shop2", key), _submit(store, "shop2", key)
    _mid_run(dispatcher, old)
    assert "waits queued" in _handle(dispatcher, new.task_id).reason
    assert store.tasks.get(old.task_id).status is TaskStatus.CANCELLED
    # The cancelled task's worker stops at its next step and gives the key's slot back: to the
    # new task, admitted by the release (the hand-off) before its message is sent.
    dispatcher.fair.release(old.task_id)
    assert store.slots.holders("shop2", "customer-7") == [new.task_id]
    woken = _received_ids(queues)
    assert new.task_id in woken
    _handle(dispatcher, new.task_id)
    assert store.tasks.get(new.task_id).status is TaskStatus.SUCCEEDED
    assert store.slots.holders("shop2", "customer-7") == []


def test_a_task_acting_for_an_end_user_cancels_only_its_own_users_holders_and_waits_for_the_others_slot(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    """A key's slots are the tenant's, shared by every end user's tasks (an agent's key is every
    user's of that agent): alice's ``cancel_running`` cancelled bob's task and the tenant's own
    too. Now it cancels alice's holder only; bob's and the tenant's (acting for no user) run on,
    and alice's new task waits queued, first in the key's line, for a slot to free by itself."""
    dispatcher = _dispatcher(store, queues, registry, limit=None)
    _received(queues)
    key = {"key": "support-pool", "limit": 3, "on_conflict": "cancel_running"}
    bobs, tenants, alices = (_submit(store, "pool", key, user="bob"), _submit(store, "pool", key),
                             _submit(store, "pool", key, user="alice"))  # fmt: skip
    for holder in (bobs, tenants, alices):
        _mid_run(dispatcher, holder)
    new = _submit(store, "pool", key, user="alice")
    assert "waits queued" in _handle(dispatcher, new.task_id).reason
    statuses = {t.task_id: store.tasks.get(t.task_id).status for t in (bobs, tenants, alices)}
    assert statuses == {bobs.task_id: TaskStatus.RUNNING, tenants.task_id: TaskStatus.RUNNING,
                        alices.task_id: TaskStatus.CANCELLED}  # fmt: skip
    dispatcher.fair.release(alices.task_id)  # alice's cancelled task stops: its slot is the new one's
    assert sorted(store.slots.holders("pool", "support-pool")) == sorted([bobs.task_id, tenants.task_id, new.task_id])
    assert _received_ids(queues) == [new.task_id]
    # A key bob's task alone holds: alice's cancels nothing and waits for bob's slot.
    desk = {**key, "key": "desk", "limit": 1}
    bobs, alices = _submit(store, "pool", desk, user="bob"), _submit(store, "pool", desk, user="alice")
    _mid_run(dispatcher, bobs)
    assert "waits queued" in _handle(dispatcher, alices.task_id).reason
    assert store.tasks.get(bobs.task_id).status is TaskStatus.RUNNING
    store.tasks.transition(bobs.task_id, TaskStatus.SUCCEEDED)  # bob's task ends by itself
    dispatcher.fair.release(bobs.task_id)  # and gives its slot back: to alice's
    assert store.slots.holders("pool", "desk") == [alices.task_id]
    assert _received_ids(queues) == [alices.task_id]


def test_cancel_running_takes_the_slot_it_freed_ahead_of_the_keys_waiters_and_of_a_later_submission(
    settings_store: Storage, settings_registry: Any, queues: TaskQueues
) -> None:
    """TASKS.md: ``cancel_running`` "cancels the key's running tasks and starts when they have
    stopped". On DynamoDB (moto server): tasks already waiting on the key, and one submitted
    between the holders' stop and the new task's message, all come after it, in their order."""
    store, registry = settings_store, settings_registry
    dispatcher = _dispatcher(store, queues, registry, limit=None)
    _received(queues)
    tenant, key = f"shop-{uuid.uuid4().hex[:6]}", "customer-9"
    queue_key = {"key": key, "limit": 1, "on_conflict": "queue"}
    holder = _submit(store, tenant, queue_key)
    _mid_run(dispatcher, holder)
    waiters = [_submit(store, tenant, queue_key) for _ in range(2)]
    for waiter in waiters:  # parked on the key, in their order
        assert "waits queued" in _handle(dispatcher, waiter.task_id).reason
    new = _submit(store, tenant, {**queue_key, "on_conflict": "cancel_running"})
    assert "waits queued" in _handle(dispatcher, new.task_id).reason
    assert store.tasks.get(holder.task_id).status is TaskStatus.CANCELLED

    # The cancelled holder's worker stops at its next step and gives the key's slot back.
    dispatcher.fair.release(holder.task_id)
    assert store.slots.holders(tenant, key) == [new.task_id]  # the slot went to it, at the release
    assert _received_ids(queues) == [new.task_id]
    late = submit_once(store, registry, scripted([{"text": "late"}]).model_copy(
        update={"concurrency": Concurrency.model_validate(queue_key)}), tenant=tenant, queues=queues)  # fmt: skip
    assert late.task.status is TaskStatus.QUEUED and _received_ids(queues) == []  # it waits behind

    # Each end hands the key's slot to the next in line and sends its message: the chain of
    # wakes is the order they run in.
    order, running = [], [new.task_id]
    while running:
        (task_id,) = running
        assert _handle(dispatcher, task_id).kind == "delete"
        assert store.tasks.get(task_id).status is TaskStatus.SUCCEEDED
        order.append(task_id)
        running = _received_ids(queues)
        assert store.slots.holders(tenant, key) == running
    assert order == [new.task_id, *(w.task_id for w in waiters), late.task.task_id]
    assert store.slots.holders(tenant, key) == []
    assert all(store.tasks.get(w.task_id).status is TaskStatus.SUCCEEDED for w in waiters)


def test_a_submission_over_its_tenants_limit_never_enters_the_queue(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    _received(queues)
    defaults = Defaults(tenant_max_running=1)
    first = submit_once(store, registry, scripted([{"text": "a"}]), tenant="burst", queues=queues, defaults=defaults)
    second = submit_once(store, registry, scripted([{"text": "b"}]), tenant="burst", queues=queues, defaults=defaults)
    sent = _received_ids(queues)
    assert sent == [first.task.task_id]  # the second waits on the tenant's list, not in the queue
    assert store.tasks.get(second.task.task_id).status is TaskStatus.QUEUED
    assert store.slots.with_default(1).usage("burst") == SlotUsage(tenant="burst", running=1, waiting=1, limit=1)

    dispatcher = _dispatcher(store, queues, registry, limit=1)
    _handle(dispatcher, first.task.task_id)  # runs, ends, and its slot wakes the second
    (woken,) = _received(queues)
    assert TaskMessage.model_validate_json(woken["Body"]).task_id == second.task.task_id


def test_raising_a_tenants_limit_wakes_as_many_waiting_tasks_as_it_made_room_for(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    _received(queues)
    defaults = Defaults(tenant_max_running=1)
    ids = [
        submit_once(store, registry, scripted([{"text": "a"}]), tenant="grows", queues=queues, defaults=defaults)
        for _ in range(4)
    ]
    assert len(_received(queues)) == 1  # one admitted, three waiting
    store.slots.set_limit("grows", 1)
    usage = set_max_running(store, "grows", 3, queues)
    woken = _received_ids(queues)
    assert woken == [ids[1].task.task_id, ids[2].task.task_id]  # oldest first, two slots made
    assert usage.waiting == 1 and usage.limit == 3


def test_a_task_taken_over_from_a_dead_worker_keeps_its_one_slot_and_gives_it_back_when_it_ends(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    task = _submit(store, "orphaned")
    assert dispatcher.fair.admit(task, "normal").waits is None
    claimed = store.tasks.claim(task.task_id, "dead-worker", 30)
    assert claimed is not None
    store.tasks.release(claimed[0])  # its lease lapses: the recovery path hands its message on
    assert _handle(dispatcher, task.task_id).kind == "delete"  # taken over: no second slot asked for
    assert store.tasks.get(task.task_id).status is TaskStatus.SUCCEEDED
    assert store.slots.usage("orphaned").running == 0


def test_an_agents_concurrency_key_holds_its_tasks_unless_the_submission_names_its_own(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    spec = {"name": "nightly", "provider": "scripted", "script": {"turns": [{"text": "done"}]},
            "concurrency": {"key": "nightly-report", "limit": 1, "on_conflict": "skip"}}  # fmt: skip
    create_agent(store, registry, spec, tenant="ops")
    first = submit_once(store, registry, {"goal": "report", "agent": "nightly"}, tenant="ops", queues=queues)
    assert first.task.submission.concurrency == Concurrency(key="nightly-report", limit=1, on_conflict="skip")
    second = submit_once(store, registry, {"goal": "report", "agent": "nightly"}, tenant="ops", queues=queues)
    assert store.tasks.get(second.task.task_id).status is TaskStatus.CANCELLED  # the key is held: skipped
    own = {"goal": "report", "agent": "nightly", "concurrency": {"key": "customer-9"}}
    third = submit_once(store, registry, own, tenant="ops", queues=queues)
    assert third.task.submission.concurrency == Concurrency(key="customer-9")
    assert store.tasks.get(third.task.task_id).status is TaskStatus.QUEUED


class ConflictingTable:
    """The storage table, but its transactions meet ``conflicts`` TransactionConflicts first
    (DynamoDB's answer when another transaction writes the same hot slot item at the same
    moment; neither the memory twin nor moto ever gives it)."""

    def __init__(self, table: Any, conflicts: float) -> None:
        self.table, self.conflicts, self.met = table, conflicts, 0

    def transact(self, actions: Any, **kwargs: Any) -> None:
        if self.met < self.conflicts:
            self.met += 1
            raise TransactionConflict("another transaction on the slot item")
        self.table.transact(actions, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.table, name)


def test_a_release_that_meets_a_transaction_conflict_tries_again_and_gives_the_slot_back(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    task = _submit(store, "hot")
    _mid_run(dispatcher, task)
    store.tasks.transition(task.task_id, TaskStatus.SUCCEEDED)
    conflicting = ConflictingTable(store.slots.table, conflicts=2)
    assert RunningSlots(conflicting, 1).release(task.task_id) == [keys.tenant_pk("hot")]
    assert conflicting.met == 2 and store.slots.usage("hot").running == 0
    assert not store.slots.holds_slots(task.task_id)


def test_a_release_that_keeps_meeting_conflicts_raises_so_its_message_comes_back_and_releases(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    task = _submit(store, "hotter")
    assert dispatcher.fair.admit(task, "normal").waits is None
    real = dispatcher.fair.slots
    dispatcher.fair.slots = RunningSlots(ConflictingTable(store.slots.table, conflicts=math.inf), 1)
    with pytest.raises(TransactionConflict):  # the adapter keeps the message (a worker error)
        _handle(dispatcher, task.task_id)
    assert store.tasks.get(task.task_id).status is TaskStatus.SUCCEEDED and store.slots.holds_slots(task.task_id)
    dispatcher.fair.slots = real
    assert _handle(dispatcher, task.task_id).kind == "delete"  # the next delivery releases
    assert store.slots.usage("hotter").running == 0 and not store.slots.holds_slots(task.task_id)


def test_a_task_that_runs_out_of_retries_ends_failed_and_gives_its_slot_back(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    dispatcher.max_receive_count = 1
    task = _submit(store, "outage")

    def outage(task_id: str, **_: Any) -> Any:
        store.tasks.claim(task_id, "w", 30)
        raise RuntimeError("provider outage")

    dispatcher.engine.run = outage  # type: ignore[method-assign]
    assert _handle(dispatcher, task.task_id).kind == "dead_letter"
    assert store.tasks.get(task.task_id).status is TaskStatus.FAILED
    assert not store.slots.holds_slots(task.task_id) and store.slots.usage("outage").running == 0


def test_a_task_that_cannot_be_read_is_dead_lettered_and_gives_its_slot_back(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    task = _submit(store, "garbled")
    _mid_run(dispatcher, task)
    store.slots.table.update(keys.meta_key(task.task_id), Update(set={"created_at": "not a time"}))
    assert _handle(dispatcher, task.task_id).kind == "dead_letter"
    assert not store.slots.holds_slots(task.task_id) and store.slots.usage("garbled").running == 0


def test_a_parked_task_whose_wake_came_before_its_recheck_admits_again_rather_than_run_without_a_slot(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    _received(queues)
    running, parked, other = _submit(store, "race"), _submit(store, "race"), _submit(store, "race")
    _mid_run(dispatcher, running)
    slots = dispatcher.fair.slots
    real_park, real_has_room = slots.park, slots.has_room
    stale_reads = [True]  # the parked task reads the slot free: before the other task takes it

    def park(task: Task, slot: Any, tier: str, **kwargs: Any) -> None:
        real_park(task, slot, tier, **kwargs)
        if task.task_id == parked.task_id and stale_reads:
            # The running task ends: its release wakes the parked task (deletes its item, sends
            # its message), and another worker admits a third task into the freed slot.
            store.tasks.transition(running.task_id, TaskStatus.SUCCEEDED)
            dispatcher.fair.release(running.task_id)
            assert dispatcher.fair.admit(store.tasks.get(other.task_id), "normal").waits is None

    slots.park = park  # type: ignore[method-assign]
    slots.has_room = lambda slot: stale_reads.pop() if stale_reads else real_has_room(slot)  # type: ignore[method-assign]
    gate = dispatcher.fair.admit(store.tasks.get(parked.task_id), "normal")
    assert gate.waits is not None and not store.slots.holds_slots(parked.task_id)  # it does not run
    assert store.slots.with_default(1).usage("race") == SlotUsage(tenant="race", running=1, waiting=1, limit=1)


def test_a_task_whose_admissions_keep_conflicting_keeps_its_message_and_runs_on_a_later_delivery(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=2)
    task = _submit(store, "contended")
    real = dispatcher.fair.slots
    dispatcher.fair.slots = RunningSlots(ConflictingTable(store.slots.table, conflicts=math.inf), 2)
    kept = _handle(dispatcher, task.task_id)
    assert kept.kind == "retry" and kept.delay_seconds >= 1  # not deleted: nothing else would wake it
    assert store.tasks.get(task.task_id).status is TaskStatus.QUEUED and not store.slots.holds_slots(task.task_id)
    assert store.slots.with_default(2).usage("contended").waiting == 0
    dispatcher.fair.slots = real
    assert _handle(dispatcher, task.task_id).kind == "delete"
    assert store.tasks.get(task.task_id).status is TaskStatus.SUCCEEDED


def test_a_task_refused_whose_every_recheck_finds_room_keeps_its_message_rather_than_lose_its_wait(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=2)
    task = _submit(store, "flicker")
    # Each admission is refused, yet each re-check finds room: a slot freed in between, every time.
    dispatcher.fair.slots.admit = lambda task, slots, **_: Admission("refused", slots[0])  # type: ignore[method-assign]
    kept = _handle(dispatcher, task.task_id)
    assert kept.kind == "retry" and "comes back" in kept.reason
    assert store.slots.with_default(2).usage("flicker").waiting == 0  # it took its item back each time
    assert store.tasks.get(task.task_id).status is TaskStatus.QUEUED


@pytest.mark.parametrize("on_conflict", ["skip", "cancel_running"])
def test_a_task_resuming_work_it_started_queues_for_its_key_instead_of_skipping_or_cancelling(
    store: Storage, queues: TaskQueues, registry: Any, on_conflict: str
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=None)
    _received(queues)
    key = {"key": "conversation-3", "limit": 1, "on_conflict": on_conflict}
    parent = _submit(store, "resumes", key)
    _mid_run(dispatcher, parent)
    store.tasks.transition(parent.task_id, TaskStatus.WAITING)  # waits for its children: its slot freed
    dispatcher.fair.release(parent.task_id)
    newer = _submit(store, "resumes", key)
    _mid_run(dispatcher, newer)
    store.tasks.transition(parent.task_id, TaskStatus.QUEUED)  # its children ended: woken
    assert "waits queued" in _handle(dispatcher, parent.task_id).reason
    assert store.tasks.get(parent.task_id).status is TaskStatus.QUEUED
    assert store.tasks.get(newer.task_id).status is TaskStatus.RUNNING


def test_a_skipped_task_reports_its_end_its_callback_and_releases_the_tasks_that_depend_on_it(
    store: Storage, queues: TaskQueues, registry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=None)
    key = {"key": "customer-5", "limit": 1, "on_conflict": "skip"}
    _mid_run(dispatcher, _submit(store, "deps", key))
    body = {**scripted([{"text": "x"}]).model_dump(), "concurrency": key, "notify": {"url": "https://example.com/h"}}
    skipped = store.tasks.create(TaskSubmission.model_validate(body), tenant="deps")
    after = {**scripted([{"text": "y"}]).model_dump(), "depends_on": [skipped.task_id]}
    dependent = submit_once(store, registry, after, tenant="deps", queues=queues).task
    assert store.tasks.get(dependent.task_id).status is TaskStatus.BLOCKED
    sent: list[str] = []
    monkeypatch.setattr(queues, "send_webhook", sent.append)

    assert "skipped" in _handle(dispatcher, skipped.task_id).reason
    assert store.tasks.get(skipped.task_id).status is TaskStatus.CANCELLED
    assert store.tasks.get(dependent.task_id).status is not TaskStatus.BLOCKED
    assert len(sent) == 1 and '"cancelled"' in sent[0] and skipped.task_id in sent[0]


def test_a_submission_skipped_by_its_key_is_answered_cancelled(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    key = {"key": "customer-6", "limit": 1, "on_conflict": "skip"}
    body = {**scripted([{"text": "x"}]).model_dump(), "concurrency": key}
    first = submit_once(store, registry, body, tenant="answers", queues=queues)
    assert first.task.status is TaskStatus.QUEUED
    second = submit_once(store, registry, body, tenant="answers", queues=queues)
    assert second.task.status is TaskStatus.CANCELLED and second.task.error is not None
    assert second.task.error["code"] == "concurrency_skipped"
    _received(queues)


def test_a_woken_task_cancelled_before_its_message_is_read_passes_its_wake_to_the_next_waiter(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    _received(queues)
    running, first, second = _submit(store, "passes"), _submit(store, "passes"), _submit(store, "passes")
    _mid_run(dispatcher, running)
    assert "waits queued" in _handle(dispatcher, first.task_id).reason
    assert "waits queued" in _handle(dispatcher, second.task_id).reason
    store.tasks.transition(running.task_id, TaskStatus.SUCCEEDED)
    dispatcher.fair.release(running.task_id)
    assert _received_ids(queues) == [first.task_id]
    cancel(store, first.task_id, queues=queues)  # the user gives up on it before its message is read
    _handle(dispatcher, first.task_id)
    assert _received_ids(queues) == [second.task_id]


def test_a_task_woken_by_its_tenant_but_refused_by_its_key_passes_the_tenants_wake_on(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    _received(queues)
    key = {"key": "customer-8", "limit": 1}
    holder = _submit(store, "keyed", key)
    _mid_run(dispatcher, holder)  # holds the tenant's one slot and the key's
    keyed, plain = _submit(store, "keyed", key), _submit(store, "keyed")
    assert "waits queued" in _handle(dispatcher, keyed.task_id).reason  # on the tenant's list
    assert "waits queued" in _handle(dispatcher, plain.task_id).reason
    set_max_running(store, "keyed", 2, queues)  # room for one more on the tenant, none on the key
    assert _received_ids(queues) == [keyed.task_id]
    assert "concurrency key's" in _handle(dispatcher, keyed.task_id).reason  # refused by the key: re-parks
    assert _received_ids(queues) == [plain.task_id]


def test_a_wake_skips_a_waiter_admitted_meanwhile_by_another_route_and_wakes_the_next(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    _received(queues)
    running, admitted, waiting = _submit(store, "stale"), _submit(store, "stale"), _submit(store, "stale")
    _mid_run(dispatcher, running)
    assert "waits queued" in _handle(dispatcher, admitted.task_id).reason
    assert "waits queued" in _handle(dispatcher, waiting.task_id).reason
    store.slots.set_limit("stale", 2)  # room, and a swept message admits the first waiter: its item stays
    assert dispatcher.fair.admit(store.tasks.get(admitted.task_id), "normal").waits is None
    store.tasks.transition(running.task_id, TaskStatus.SUCCEEDED)
    dispatcher.fair.release(running.task_id)
    assert _received_ids(queues) == [waiting.task_id]


def test_cancel_running_parks_the_new_task_even_when_a_holder_of_its_key_no_longer_exists(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    dispatcher = _dispatcher(store, queues, registry, limit=None)
    _received(queues)
    key = {"key": "customer-purged", "limit": 1, "on_conflict": "cancel_running"}
    holder = _submit(store, "ghosts", key)
    _mid_run(dispatcher, holder)
    for item in store.slots.table.query(keys.task_pk(holder.task_id)):  # TTL purges it; its HOLD item stays
        store.slots.table.delete({"pk": item["pk"], "sk": item["sk"]})
    assert store.slots.holders("ghosts", "customer-purged") == [holder.task_id]
    late = _submit(store, "ghosts", key)
    assert "waits queued" in _handle(dispatcher, late.task_id).reason  # no TaskNotFound, no redelivery loop


class _SendRaisesAfterSqsTookIt(ABC):
    """Queues whose send reaches SQS and then raises (a timeout after SQS took the message),
    with ``meanwhile`` done in between: what a worker did with the task before the caller saw
    the error."""

    def __init__(self, queues: TaskQueues, store: Storage) -> None:
        self.queues, self.store = queues, store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queues, name)

    def send(self, task_id: str, tier: str, **kwargs: Any) -> None:
        self.queues.send(task_id, tier, **kwargs)
        self.meanwhile(task_id, tier)
        raise TimeoutError("the send timed out after SQS took the message")

    @abstractmethod
    def meanwhile(self, task_id: str, tier: str) -> None: ...


class _SentThenRaised(_SendRaisesAfterSqsTookIt):
    """A worker claims the task in between, as a fast one would."""

    def meanwhile(self, task_id: str, tier: str) -> None:
        assert self.store.tasks.claim(task_id, "fast-worker", 30) is not None


def test_a_submission_whose_send_raised_after_sqs_took_it_keeps_the_slot_its_running_task_holds(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    _received(queues)
    defaults = Defaults(tenant_max_running=2)
    flaky = _SentThenRaised(queues, store)
    submitted = submit_once(store, registry, scripted([{"text": "a"}]), tenant="timeout", queues=flaky,  # type: ignore[arg-type]
                            defaults=defaults)  # fmt: skip
    task = store.tasks.get(submitted.task.task_id)
    assert task.status is TaskStatus.RUNNING and task.slots  # it runs, counted
    assert store.slots.with_default(2).usage("timeout").running == 1
    _received(queues)


class _SentThenAdmittedUnderANewLimit(_SendRaisesAfterSqsTookIt):
    """An override is set in between and a worker admits the task under it (it was unlimited
    when submitted: no slot then)."""

    def meanwhile(self, task_id: str, tier: str) -> None:
        task = self.store.tasks.get(task_id)
        self.store.slots.set_limit(task.tenant, 1)
        assert FairShare(self.store, self.queues).admit(task, tier).waits is None


def test_a_submission_needing_no_slot_whose_send_raised_after_a_worker_admitted_it_gives_that_slot_back(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    _received(queues)
    with pytest.raises(TimeoutError):
        submit_once(store, registry, scripted([{"text": "a"}]), tenant="late-limit",
                    queues=_SentThenAdmittedUnderANewLimit(queues, store))  # type: ignore[arg-type]  # fmt: skip
    assert store.tasks.list_for_tenant("late-limit", limit=10, roots_only=False)[0] == []
    assert store.slots.usage("late-limit").running == 0  # not deleted with the slot it held
    _received(queues)


def test_clearing_an_override_with_no_default_wakes_every_waiter_not_only_the_first_thousand(
    store: Storage, queues: TaskQueues, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.slots.set_limit("crowd", 1)
    slot = store.slots.slots_for(_submit(store, "crowd"))[0]
    waiting = [_submit(store, "crowd") for _ in range(1005)]
    for task in waiting:
        store.slots.park(task, slot, "normal")
    sent: list[str] = []
    monkeypatch.setattr(queues, "send", lambda task_id, tier, **_: sent.append(task_id))
    set_max_running(store, "crowd", None, queues)
    assert len(sent) == 1005 and sent[:2] == [waiting[0].task_id, waiting[1].task_id]


def test_a_freed_fleet_slot_goes_to_the_waiting_tenant_furthest_below_its_share_admitted_before_its_message(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    """Fleet capacity 2, weights 3:1: the heavy tenant holds both slots, both tenants wait.
    The heavy task's end wakes the light tenant's task (0/1 < 1/3) and admits it before its
    message is sent, so the next wake already counts it."""
    _received(queues)
    dispatcher = _dispatcher(store, queues, registry, limit=None)
    dispatcher.fair = FairShare(store, queues, fleet_capacity=2, fleet_name=f"FLEET-{uuid.uuid4().hex[:8]}")
    store.slots.set_weight("heavy", 3)
    running = [_submit(store, "heavy") for _ in range(2)]
    for task in running:
        assert dispatcher.fair.admit(task, "normal").waits is None
    heavy_waiter, light_waiter = _submit(store, "heavy"), _submit(store, "light")
    for task in (heavy_waiter, light_waiter):
        assert "the fleet is full" in (dispatcher.fair.admit(task, "normal").waits or "")

    _handle(dispatcher, running[0].task_id)  # runs, ends, releases: one fleet slot frees
    (woken,) = _received(queues)
    assert TaskMessage.model_validate_json(woken["Body"]).task_id == light_waiter.task_id
    assert store.tasks.get(light_waiter.task_id).slots  # admitted by its waker
    assert dispatcher.fair.slots.usage("light").running == 1 and dispatcher.fair.slots.usage("heavy").waiting == 1
    _handle(dispatcher, light_waiter.task_id)  # its message finds it admitted: it runs, and wakes heavy's
    (woken,) = _received(queues)
    assert TaskMessage.model_validate_json(woken["Body"]).task_id == heavy_waiter.task_id


class _SendFails:
    def __init__(self, queues: TaskQueues) -> None:
        self.queues = queues

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queues, name)

    def send(self, task_id: str, tier: str, **kwargs: Any) -> None:
        raise ConnectionError("SQS is unreachable")


def test_a_submission_whose_send_failed_is_deleted_with_the_slot_it_was_admitted_to(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    defaults = Defaults(tenant_max_running=2)
    with pytest.raises(ConnectionError):
        submit_once(store, registry, scripted([{"text": "a"}]), tenant="down", queues=_SendFails(queues),  # type: ignore[arg-type]
                    defaults=defaults)  # fmt: skip
    assert store.slots.with_default(2).usage("down").running == 0  # given back with the task
    assert store.tasks.list_for_tenant("down", limit=10, roots_only=False)[0] == []


class _SendFailsOnAHotTable:
    """Queues whose send fails outright, after which the slot items are hot: the deletion's
    transaction meets two TransactionConflicts first (DynamoDB's answer; see ConflictingTable)."""

    def __init__(self, queues: TaskQueues, store: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
        self.queues, self.store, self.monkeypatch = queues, store, monkeypatch
        self.hot: ConflictingTable | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queues, name)

    def send(self, task_id: str, tier: str, **kwargs: Any) -> None:
        self.hot = ConflictingTable(self.store.tasks.table, conflicts=2)
        self.monkeypatch.setattr(self.store.tasks, "table", self.hot)
        raise ConnectionError("SQS is unreachable")


def test_a_submission_whose_send_failed_is_deleted_with_its_slot_through_transaction_conflicts(
    store: Storage, queues: TaskQueues, registry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client sees the send's own error, not a conflict that would leave the task created,
    admitted and unsent."""
    defaults = Defaults(tenant_max_running=2)
    failing = _SendFailsOnAHotTable(queues, store, monkeypatch)
    with pytest.raises(ConnectionError):
        submit_once(store, registry, scripted([{"text": "a"}]), tenant="hot-delete", queues=failing,  # type: ignore[arg-type]
                    defaults=defaults)  # fmt: skip
    assert failing.hot is not None and failing.hot.met == 2
    assert store.slots.with_default(2).usage("hot-delete").running == 0
    assert store.tasks.list_for_tenant("hot-delete", limit=10, roots_only=False)[0] == []


def _saturated_fleet(store: Storage, fair: FairShare, backlog: int) -> list[Task]:
    """Capacity 8 held 4:4 by "heavy" (weight 3) and "light", each with ``backlog`` tasks
    waiting on the fleet's lists: the running tasks."""
    fair.slots.set_weight("heavy", 3)
    running = []
    for tenant in ("heavy", "light") * 4:
        task = _submit(store, tenant)
        assert fair.admit(task, "normal").waits is None
        running.append(task)
    for tenant in ("heavy", "light") * backlog:
        assert "the fleet is full" in (fair.admit(_submit(store, tenant), "normal").waits or "")
    return running


def test_a_cohort_of_fleet_slots_freed_before_any_woken_task_is_admitted_by_its_message_is_shared_by_weight(
    store: Storage, queues: TaskQueues, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight tasks end together and their eight wakes happen before any woken message is read
    (a poll away). Counted only on arrival, the woken tasks would leave every wake reading the
    same counts, and all but one go to the same tenant; handed off (admitted by their waker),
    the eight go 6:2, the weights 3:1."""
    sent: list[str] = []
    monkeypatch.setattr(queues, "send", lambda task_id, tier, **_: sent.append(task_id))
    fair = FairShare(store, queues, fleet_capacity=8, fleet_name=f"FLEET-{uuid.uuid4().hex[:8]}")
    for task in _saturated_fleet(store, fair, backlog=10):
        assert store.tasks.claim(task.task_id, "w", 30) is not None
        store.tasks.transition(task.task_id, TaskStatus.SUCCEEDED)
        fair.release(task.task_id)
    woken = [store.tasks.get(task_id) for task_id in sent]
    assert sorted(t.tenant for t in woken) == ["heavy"] * 6 + ["light"] * 2
    assert all(t.slots for t in woken)  # admitted by their wakers, before their messages
    assert fair.slots.usage("heavy").running == 6 and fair.slots.usage("light").running == 2


def _ended(store: Storage, task: Task) -> Task:
    assert store.tasks.claim(task.task_id, "w", 30) is not None
    store.tasks.transition(task.task_id, TaskStatus.SUCCEEDED)
    return task


def test_a_woken_task_whose_message_could_not_be_sent_stays_admitted_and_the_sweeper_sends_it_after_stale_after(
    store: Storage, queues: TaskQueues, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waker admitted the woken task, then its send failed: the task keeps its slots (no
    give-back a worker holding its message could race), and the sweeper re-sends it once it has
    been quiet for ``stale_after`` since the hand-off (which touched it), not since its creation."""
    fair = FairShare(store, queues, fleet_capacity=8, fleet_name=f"FLEET-{uuid.uuid4().hex[:8]}")
    running = _saturated_fleet(store, fair, backlog=1)
    ended = _ended(store, running[0])
    created = time.time()
    handed_off_at = created + 1000  # the waiter waited a while
    monkeypatch.setattr(time, "time", lambda: handed_off_at)

    def unreachable(task_id: str, tier: str, **_: Any) -> None:
        raise ConnectionError("SQS is unreachable")

    monkeypatch.setattr(queues, "send", unreachable)
    with pytest.raises(ConnectionError):  # the releaser's message comes back, as for any failed wake
        fair.release(ended.task_id)
    monkeypatch.setattr(time, "time", lambda: handed_off_at + 10)
    handed = next(t for t in store.tasks.list_for_tenant("heavy", limit=10, roots_only=False)[0]
                  if t.slots and t.task_id not in {r.task_id for r in running})  # fmt: skip
    assert fair.slots.usage("heavy").running == 4 and fair.slots.usage("heavy").waiting == 0
    sent: list[str] = []
    monkeypatch.setattr(queues, "send", lambda task_id, tier, **_: sent.append(task_id))
    early = sweep(store, queues, stale_after=960, now=handed_off_at + 10)
    assert handed.task_id not in early.swept  # 1010 s since its creation, 10 since its hand-off
    late = sweep(store, queues, stale_after=960, now=handed_off_at + 961)
    assert handed.task_id in late.swept and store.tasks.get(handed.task_id).slots


class _SentThenGated:
    """Queues whose send reaches SQS and then raises (a timeout after SQS took the message),
    with a worker reading the message and gating the task in between: it is admitted, so the
    worker goes on to claim it."""

    def __init__(self, queues: TaskQueues, store: Storage, fair: FairShare) -> None:
        self.queues, self.store, self.fair = queues, store, fair
        self.gates: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queues, name)

    def send(self, task_id: str, tier: str, **kwargs: Any) -> None:
        self.gates[task_id] = self.fair.admit(self.store.tasks.get(task_id), tier)
        raise TimeoutError("the send timed out after SQS took the message")


def test_a_woken_task_whose_send_raised_while_a_worker_gated_it_runs_holding_its_slots(
    store: Storage, queues: TaskQueues
) -> None:
    """The worker's gate found the hand-off's slots and let it claim: the task runs counted in
    the fleet and its tenant, never on slots given back behind the worker's back."""
    fair = FairShare(store, queues, fleet_capacity=8, fleet_name=f"FLEET-{uuid.uuid4().hex[:8]}")
    ended = _ended(store, _saturated_fleet(store, fair, backlog=1)[0])
    flaky = _SentThenGated(queues, store, fair)
    fair.queues = flaky  # type: ignore[assignment]
    with pytest.raises(TimeoutError):
        fair.release(ended.task_id)
    ((woken, gate),) = flaky.gates.items()
    assert gate.limited and gate.waits is None and gate.keep is None  # admitted: the worker claims it
    assert store.tasks.claim(woken, "x", 30) is not None
    assert store.tasks.get(woken).slots and fair.slots.usage("heavy").running == 4
    assert fair.slots._fleet_room(8) == 0  # the fleet counts it: 8 running of 8


def test_a_woken_task_cancelled_while_its_send_failed_gives_its_slots_back_and_wakes_the_next(
    store: Storage, queues: TaskQueues, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled between the hand-off and the failed send, the task has no message and ends,
    so neither a worker nor the sweeper would ever release it: the cancel gives its slots back
    and wakes the fleet's next waiter."""
    fair = FairShare(store, queues, fleet_capacity=8, fleet_name=f"FLEET-{uuid.uuid4().hex[:8]}")
    ended = _ended(store, _saturated_fleet(store, fair, backlog=2)[0])
    sent: list[str] = []
    recording = _Recording(sent)

    def cancelled_meanwhile(task_id: str, tier: str, **_: Any) -> None:
        cancel(store, task_id, queues=recording, slots=fair.slots)  # type: ignore[arg-type]
        raise ConnectionError("SQS is unreachable")

    monkeypatch.setattr(queues, "send", cancelled_meanwhile)
    with pytest.raises(ConnectionError):
        fair.release(ended.task_id)
    heavy = store.tasks.list_for_tenant("heavy", limit=10, roots_only=False)[0]
    (gone,) = [t for t in heavy if t.status is TaskStatus.CANCELLED]
    assert not gone.slots
    (woken,) = sent  # the fleet slot it gave back went on to the next waiter
    assert store.tasks.get(woken).status is TaskStatus.QUEUED and woken != gone.task_id
    assert fair.slots.usage("heavy").running + fair.slots.usage("light").running == 7  # 7 running, 1 woken


class _Recording:
    def __init__(self, sent: list[str]) -> None:
        self.sent = sent

    def send(self, task_id: str, tier: str, **_: Any) -> None:
        self.sent.append(task_id)


def test_a_woken_task_deleted_before_its_hand_off_passes_the_wake_on(
    store: Storage, queues: TaskQueues, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter the wake took was deleted (TTL, a purge) before the waker read it: the freed
    fleet slot goes to the next choice, not to nobody until the next release or sweep."""
    fair = FairShare(store, queues, fleet_capacity=8, fleet_name=f"FLEET-{uuid.uuid4().hex[:8]}")
    ended = _ended(store, _saturated_fleet(store, fair, backlog=2)[0])
    real = fair.slots.next_fleet_waiters
    deleted: list[str] = []

    def the_first_deleted_meanwhile(most: int) -> list[tuple[str, str, str, int]]:
        picked = real(most)
        if not deleted and picked:
            deleted.append(picked[0][0])
            for item in store.slots.table.query(keys.task_pk(picked[0][0])):
                store.slots.table.delete({"pk": item["pk"], "sk": item["sk"]})
        return picked

    monkeypatch.setattr(fair.slots, "next_fleet_waiters", the_first_deleted_meanwhile)
    sent: list[str] = []
    monkeypatch.setattr(queues, "send", lambda task_id, tier, **_: sent.append(task_id))
    fair.release(ended.task_id)
    (woken,) = sent
    assert woken != deleted[0] and store.tasks.get(woken).slots


def test_a_hand_off_whose_fleet_shard_was_taken_meanwhile_reads_again_and_admits_on_another(
    store: Storage, queues: TaskQueues, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the waker's read of the shards and its admission another admission takes the
    shard it picked: the hand-off reads again and admits on the shard still free, rather than
    leave the woken task to its message (which reopens the window the hand-off closes)."""
    fair = FairShare(store, queues, fleet_capacity=8, fleet_name=f"FLEET-{uuid.uuid4().hex[:8]}")
    running = _saturated_fleet(store, fair, backlog=1)
    ended = running[0]
    assert store.tasks.claim(ended.task_id, "w", 30) is not None
    store.tasks.transition(ended.task_id, TaskStatus.SUCCEEDED)
    real_slots_for = fair.slots.slots_for
    stale: list[bool] = []

    def first_read_sees_a_stale_shard(task: Task) -> list[Any]:
        slots = real_slots_for(task)
        if not stale and task.tenant == "heavy" and not task.slots:
            stale.append(True)  # once: a shard that is full now, as read a moment before
            fleet_slot = next(s for s in slots if s.fleet)
            full = next(i for i in range(4) if fleet_slots.shard_pk(i, fair.slots.fleet_name) != fleet_slot.pk)
            return [
                s if not s.fleet else replace(s, pk=fleet_slots.shard_pk(full, fair.slots.fleet_name)) for s in slots
            ]
        return slots

    monkeypatch.setattr(fair.slots, "slots_for", first_read_sees_a_stale_shard)
    sent: list[str] = []
    monkeypatch.setattr(queues, "send", lambda task_id, tier, **_: sent.append(task_id))
    fair.release(ended.task_id)
    (woken,) = sent
    assert stale and store.tasks.get(woken).slots  # admitted by its waker on the second read
    assert fair.slots.usage("heavy").running == 4


class _QueryRecordingTable:
    """The storage table, recording the partition of every Query."""

    def __init__(self, table: Any) -> None:
        self.table, self.queried = table, list[str]()

    def query(self, pk: str, *args: Any, **kwargs: Any) -> Any:
        self.queried.append(pk)
        return self.table.query(pk, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.table, name)


def test_the_release_of_an_unlimited_tenants_fleet_counted_slot_reads_no_waiting_list_of_the_tenant(
    store: Storage, queues: TaskQueues
) -> None:
    """Under a fleet an unlimited tenant's running count is kept (for the weights), so its
    release frees a tenant slot; nobody waits for a slot without a limit, so no Query of its list."""
    name = f"FLEET-{uuid.uuid4().hex[:8]}"
    recording = _QueryRecordingTable(store.slots.table)
    fair = FairShare(store, queues, fleet_capacity=4, fleet_name=name)
    fair.slots = RunningSlots(recording, None, 4, name)
    task = _submit(store, "boundless")
    assert fair.admit(task, "normal").waits is None
    assert store.tasks.claim(task.task_id, "w", 30) is not None
    store.tasks.transition(task.task_id, TaskStatus.SUCCEEDED)
    assert keys.tenant_pk("boundless") in fair.release(task.task_id)
    assert keys.tenant_pk("boundless") not in recording.queried


def test_raising_a_tenants_limit_wakes_its_tasks_waiting_for_the_fleet_when_the_fleet_has_room(
    store: Storage, queues: TaskQueues, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capacity 2. "capped" (limit 2) runs one and waits on the fleet's list for a second; its
    limit is lowered to 1; the other tenant's task ends, and its wake passes "capped" over (at
    its hard limit), leaving the slot free. Raising the limit again wakes the fleet waiter."""
    name = f"FLEET-{uuid.uuid4().hex[:8]}"
    sent: list[str] = []
    monkeypatch.setattr(queues, "send", lambda task_id, tier, **_: sent.append(task_id))
    store.slots = store.slots.with_default(None, 2, name)
    fair = FairShare(store, queues, fleet_capacity=2, fleet_name=name)
    store.slots.set_limit("capped", 2)
    running, other = _submit(store, "capped"), _submit(store, "roomy")
    for task in (running, other):
        assert fair.admit(task, "normal").waits is None
    waiter = _submit(store, "capped")
    assert "the fleet is full" in (fair.admit(waiter, "normal").waits or "")
    store.slots.set_limit("capped", 1)
    assert store.tasks.claim(other.task_id, "w", 30) is not None
    store.tasks.transition(other.task_id, TaskStatus.SUCCEEDED)
    fair.release(other.task_id)
    assert sent == []  # passed over: "capped" is at its limit
    set_max_running(store, "capped", 3, queues)
    assert sent == [waiter.task_id]


def test_a_task_whose_key_and_the_fleet_are_both_full_is_refused_by_its_key(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    """Its key's ``skip`` applies at once, rather than after a fleet wake that the key refuses."""
    fair = FairShare(store, queues, fleet_capacity=1, fleet_name=f"FLEET-{uuid.uuid4().hex[:8]}")
    key = {"key": "nightly", "limit": 1, "on_conflict": "skip"}
    holder = _submit(store, "keyed", key)
    assert fair.admit(holder, "normal").waits is None  # holds the key's one slot and the fleet's one
    late = _submit(store, "keyed", key)
    gate = fair.admit(late, "normal")
    assert gate.skipped and store.tasks.get(late.task_id).status is TaskStatus.CANCELLED
    assert fair.slots.usage("keyed").waiting == 0


def test_a_task_refused_by_an_override_set_after_it_was_read_as_unlimited_is_told_so_not_a_limit_of_none(
    store: Storage, queues: TaskQueues
) -> None:
    fair = FairShare(store, queues, fleet_capacity=4, fleet_name=f"FLEET-{uuid.uuid4().hex[:8]}")
    [read_unlimited, _] = fair.slots.slots_for(_submit(store, "raced"))
    assert read_unlimited.limit is None
    assert fair._why(read_unlimited) == "its tenant's running limit was set meanwhile: waits queued for a slot"


def test_a_parked_task_says_what_it_waits_on_its_key_by_name_or_its_tenants_limit_not_a_worker(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    from agentq.api.views import task_view

    dispatcher = _dispatcher(store, queues, registry, limit=2)
    _received(queues)
    key = {"key": "customer-42", "limit": 1}
    holder, keyed = _submit(store, "acme", key), _submit(store, "acme", key)
    fresh = _submit(store, "acme")
    assert task_view(store, fresh).activity == "queued (normal priority), waiting for a worker"  # nothing parked it

    _mid_run(dispatcher, holder)
    assert "waits queued" in _handle(dispatcher, keyed.task_id).reason
    said = task_view(store, store.tasks.get(keyed.task_id)).activity
    assert said is not None and "waiting on its concurrency key 'customer-42'" in said and "worker" not in said

    other = _submit(store, "acme")
    _mid_run(dispatcher, other)  # acme's two slots are taken: the next waits on its tenant's limit
    over = _submit(store, "acme")
    assert "waits queued" in _handle(dispatcher, over.task_id).reason
    said = task_view(store, store.tasks.get(over.task_id)).activity
    assert said is not None and "your tenant's running limit" in said

    store.tasks.transition(holder.task_id, TaskStatus.SUCCEEDED)
    dispatcher.fair.release(holder.task_id)  # the key's slot frees: the keyed task is woken and admitted
    _received(queues)
    assert _handle(dispatcher, keyed.task_id).kind == "delete"
    assert store.tasks.get(keyed.task_id).status is TaskStatus.SUCCEEDED
