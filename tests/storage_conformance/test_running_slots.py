"""Running slots (storage/running_slots.py) on every backend: running ≤ limit per tenant and per
concurrency key, admission and release idempotent, waiters oldest first."""

from __future__ import annotations

import uuid

import pytest

from agentq.core.errors import ValidationError
from agentq.core.models import Task, TaskStatus, TaskSubmission
from agentq.storage import fleet_slots, keys
from agentq.storage.container import Storage
from agentq.storage.running_slots import RunningSlots, key_pk
from agentq.storage.table import TransactionCancelled, Update, plain

from tests.helpers import scripted


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"  # the DynamoDB backend is shared by the session's tests


def _fleet() -> str:
    return f"FLEET-{uuid.uuid4().hex[:8]}"  # a fleet of the test's own: its shards count only its tasks


def _task(store: Storage, tenant: str, *, key: str | None = None, limit: int = 1) -> Task:
    submission = scripted([{"text": "x"}])
    if key is not None:
        submission = TaskSubmission.model_validate(
            {**submission.model_dump(), "concurrency": {"key": key, "limit": limit}}
        )
    return store.tasks.create(submission, tenant=tenant)


def test_a_tenant_never_has_more_slots_taken_than_its_limit_and_a_second_admission_takes_none(
    backend: Storage,
) -> None:
    tenant = _tenant()
    slots = backend.slots.with_default(2)
    tasks = [_task(backend, tenant) for _ in range(3)]
    outcomes = [slots.admit(t, slots.slots_for(t)).outcome for t in tasks]
    assert outcomes == ["admitted", "admitted", "refused"]
    assert slots.admit(tasks[0], slots.slots_for(tasks[0])).outcome == "not_admissible"  # already holds it
    assert slots.usage(tenant).running == 2


def test_a_slot_comes_back_once_when_its_task_leaves_running_and_never_while_it_runs(backend: Storage) -> None:
    tenant = _tenant()
    slots = backend.slots.with_default(1)
    task = _task(backend, tenant)
    assert slots.admit(task, slots.slots_for(task)).outcome == "admitted"
    assert backend.tasks.claim(task.task_id, "w", 30) is not None
    assert slots.release(task.task_id) == []  # still running: it keeps its slot
    backend.tasks.transition(task.task_id, TaskStatus.SUCCEEDED)
    assert slots.release(task.task_id) == [keys.tenant_pk(tenant)]
    assert slots.release(task.task_id) == []  # a second release (a redelivered message) gives nothing back
    assert slots.usage(tenant).running == 0


def test_an_override_beats_the_default_and_lowering_it_below_the_running_count_stops_only_new_admissions(
    backend: Storage,
) -> None:
    tenant = _tenant()
    slots = backend.slots.with_default(1)
    slots.set_limit(tenant, 3)
    tasks = [_task(backend, tenant) for _ in range(4)]
    assert [slots.admit(t, slots.slots_for(t)).outcome for t in tasks[:3]] == ["admitted"] * 3
    slots.set_limit(tenant, 1)
    assert slots.admit(tasks[3], slots.slots_for(tasks[3])).outcome == "refused"
    assert slots.usage(tenant) == slots.usage(tenant).__class__(tenant=tenant, running=3, waiting=0, limit=1)
    for t in tasks[:3]:  # nothing was killed: each still holds its slot until it ends
        assert slots.holds_slots(t.task_id)
    slots.set_limit(tenant, None)
    assert slots.limit(tenant) == 1  # the default again


def test_a_limit_below_one_is_refused_naming_the_field(backend: Storage) -> None:
    with pytest.raises(ValidationError) as refused:
        backend.slots.set_limit(_tenant(), 0)
    assert refused.value.field == "max_running"


def test_a_concurrency_key_holds_its_own_limit_and_lists_its_holders(backend: Storage) -> None:
    tenant = _tenant()
    slots: RunningSlots = backend.slots  # no tenant limit: only the key's
    first, second = _task(backend, tenant, key="customer-42"), _task(backend, tenant, key="customer-42")
    other = _task(backend, tenant, key="customer-7")
    assert slots.admit(first, slots.slots_for(first)).outcome == "admitted"
    refused = slots.admit(second, slots.slots_for(second))
    assert (
        refused.outcome == "refused" and refused.slot is not None and refused.slot.pk == key_pk(tenant, "customer-42")
    )
    assert slots.admit(other, slots.slots_for(other)).outcome == "admitted"
    assert slots.holders(tenant, "customer-42") == [first.task_id]


def test_waiters_wake_oldest_first_as_many_as_there_is_room_skipping_cancelled_ones(backend: Storage) -> None:
    tenant = _tenant()
    slots = backend.slots.with_default(1)
    running = _task(backend, tenant)
    assert slots.admit(running, slots.slots_for(running)).outcome == "admitted"
    waiting = [_task(backend, tenant) for _ in range(3)]
    for t in waiting:
        refused = slots.admit(t, slots.slots_for(t))
        assert refused.slot is not None
        slots.park(t, refused.slot, "normal")
    backend.tasks.transition(waiting[0].task_id, TaskStatus.CANCELLED)  # gave up while it waited
    assert slots.usage(tenant).waiting == 2  # the cancelled one keeps its item, but is not counted
    assert slots.next_waiters(keys.tenant_pk(tenant)) == []  # no room yet
    assert backend.tasks.claim(running.task_id, "w", 30) is not None
    backend.tasks.transition(running.task_id, TaskStatus.SUCCEEDED)
    freed = slots.release(running.task_id)
    assert [w[0] for pk in freed for w in slots.next_waiters(pk)] == [waiting[1].task_id]
    assert slots.usage(tenant).waiting == 1  # the cancelled one is gone too; the last still waits


def test_every_tenant_with_a_slot_item_is_listed_with_its_running_waiting_and_limit(backend: Storage) -> None:
    """``all_usage`` finds the tenants by the index (no Scan): one that was admitted (the
    default limit) and one that only had a limit set; an unlimited tenant holds no slot item."""
    busy, idle, unlimited = _tenant(), _tenant(), _tenant()
    slots = backend.slots.with_default(1)
    first, second = _task(backend, busy), _task(backend, busy)
    assert slots.admit(first, slots.slots_for(first)).outcome == "admitted"
    refused = slots.admit(second, slots.slots_for(second))
    assert refused.outcome == "refused" and refused.slot is not None
    slots.park(second, refused.slot, "normal")
    slots.set_limit(idle, 5)
    free = _task(backend, unlimited)
    assert RunningSlots(backend.slots.table).admit(free, []).outcome == "admitted"

    listed = {u.tenant: (u.running, u.waiting, u.limit) for u in slots.all_usage(page=1)}
    assert listed[busy] == (1, 1, 1)
    assert listed[idle] == (0, 0, 5)
    assert unlimited not in listed


def _fleet_counts(backend: Storage, slots: RunningSlots) -> list[int]:
    shards = [backend.table.get({"pk": fleet_slots.shard_pk(i, slots.fleet_name), "sk": "RUNNING"}) for i in range(4)]
    return [int(plain(s or {}).get("running", 0)) for s in shards]


def test_a_deleted_submission_gives_back_nothing_when_a_worker_released_its_slots_after_they_were_read(
    backend: Storage,
) -> None:
    """The submission's send raised; it reads the slots to give back; meanwhile the task is
    cancelled and the worker that received its message (SQS took it) releases them. Its
    deletion must not give them back a second time (a count below zero admits one too many)."""
    tenant = _tenant()
    slots = backend.slots.with_default(2, fleet_capacity=4, fleet_name=_fleet())
    task = _task(backend, tenant)
    assert slots.admit(task, slots.slots_for(task)).outcome == "admitted"
    give_back = slots.give_back(task.task_id)
    backend.tasks.transition(task.task_id, TaskStatus.CANCELLED)
    assert len(slots.release(task.task_id)) == 2  # the worker's release: tenant and fleet back
    with pytest.raises(TransactionCancelled):
        backend.tasks.delete_unstarted(task.task_id, also=give_back.actions, only_if=give_back.condition)
    assert slots.usage(tenant).running == 0 and _fleet_counts(backend, slots) == [0, 0, 0, 0]
    assert backend.tasks.get(task.task_id).status is TaskStatus.CANCELLED


def test_a_deleted_submission_is_kept_when_a_worker_admitted_it_after_its_slots_were_read(backend: Storage) -> None:
    """Sent unadmitted (its admission kept conflicting), its send raised although SQS took it:
    the deletion read no slots, then the worker that received the message admitted it. Deleting
    it then would leave its slots held by no task, for good."""
    tenant = _tenant()
    slots = backend.slots.with_default(2, fleet_capacity=4, fleet_name=_fleet())
    task = _task(backend, tenant)
    give_back = slots.give_back(task.task_id)
    assert give_back.actions == []
    assert slots.admit(task, slots.slots_for(task)).outcome == "admitted"  # the worker's dispatcher
    with pytest.raises(TransactionCancelled):
        backend.tasks.delete_unstarted(task.task_id, also=give_back.actions, only_if=give_back.condition)
    assert backend.tasks.get(task.task_id).slots and slots.usage(tenant).running == 1
    assert sum(_fleet_counts(backend, slots)) == 1


def test_a_deleted_submission_gives_back_the_slots_it_still_holds(backend: Storage) -> None:
    tenant = _tenant()
    slots = backend.slots.with_default(2, fleet_capacity=4, fleet_name=_fleet())
    task = _task(backend, tenant, key="k")
    assert slots.admit(task, slots.slots_for(task)).outcome == "admitted"
    give_back = slots.give_back(task.task_id)
    backend.tasks.delete_unstarted(task.task_id, also=give_back.actions, only_if=give_back.condition)
    assert slots.usage(tenant).running == 0 and _fleet_counts(backend, slots) == [0, 0, 0, 0]
    assert slots.holders(tenant, "k") == []


def _fleet_round(backend: Storage, slots: RunningSlots, running: list[Task]) -> Task | None:
    """The oldest running task ends; the fleet slot it frees wakes one waiter, which is admitted."""
    ended = running.pop(0)
    assert backend.tasks.claim(ended.task_id, "w", 30) is not None
    backend.tasks.transition(ended.task_id, TaskStatus.SUCCEEDED)
    freed = slots.release(ended.task_id)
    woken = [w for pk in freed if fleet_slots.is_shard(pk) for w in slots.next_waiters(pk)]
    if not woken:
        return None
    task = backend.tasks.get(woken[0][0])
    assert slots.admit(task, slots.slots_for(task)).outcome == "admitted"
    running.append(task)
    return task


def test_a_full_fleet_wakes_the_waiting_tenant_furthest_below_its_weights_share(backend: Storage) -> None:
    """Capacity 4, tenants weighted 3:1 starting at 2:2 with both backlogged: each freed fleet
    slot goes to the tenant with the lowest running/weight, so the running counts reach 3:1 and
    stay there."""
    heavy, light = _tenant(), _tenant()
    slots = backend.slots.with_default(None, fleet_capacity=4, fleet_name=_fleet())
    slots.set_weight(heavy, 3)
    running: list[Task] = []
    for tenant in (heavy, light, heavy, light):
        task = _task(backend, tenant)
        assert slots.admit(task, slots.slots_for(task)).outcome == "admitted"
        running.append(task)
    for tenant in (heavy, light) * 6:  # the backlog: refused by the full fleet, they wait on its lists
        task = _task(backend, tenant)
        refused = slots.admit(task, slots.slots_for(task))
        assert refused.outcome == "refused" and refused.slot is not None and refused.slot.fleet
        slots.park(task, refused.slot, "normal")
    assert slots.usage(heavy).waiting == 6 and slots.usage(heavy).weight == 3

    woken = [_fleet_round(backend, slots, running) for _ in range(6)]
    assert [t.tenant if t else None for t in woken] == [heavy, heavy, heavy, light, heavy, heavy]
    counts = {t: sum(1 for r in running if r.tenant == t) for t in (heavy, light)}
    assert counts == {heavy: 3, light: 1}
    assert sum(_fleet_counts(backend, slots)) == 4  # never more than the capacity


def test_a_lone_tenant_uses_the_whole_idle_fleet_up_to_its_hard_limit_and_then_another_gets_the_rest(
    backend: Storage,
) -> None:
    """Work-conserving: nobody else waits, so a tenant runs past its weight's share, but never
    past its own limit; the fleet slot it cannot take is another tenant's."""
    alone, other = _tenant(), _tenant()
    slots = backend.slots.with_default(None, fleet_capacity=4, fleet_name=_fleet())
    slots.set_limit(alone, 3)
    outcomes = []
    for _ in range(4):
        task = _task(backend, alone)
        admission = slots.admit(task, slots.slots_for(task))
        outcomes.append((admission.outcome, admission.slot.pk if admission.slot else None))
    assert outcomes == [("admitted", None)] * 3 + [("refused", keys.tenant_pk(alone))]  # its limit, not the fleet
    late = _task(backend, other)
    assert slots.admit(late, slots.slots_for(late)).outcome == "admitted"
    assert slots.usage(alone).running == 3 and slots.usage(other).running == 1


def test_a_weight_outside_1_to_1000_or_not_a_whole_number_is_refused_naming_the_field_and_changes_nothing(
    backend: Storage,
) -> None:
    tenant = _tenant()
    slots = backend.slots.with_default(None)
    slots.set_weight(tenant, 2)
    for bad in (0, -1, 1001, 1.5, "3", True):
        with pytest.raises(ValidationError) as refused:
            slots.set_weight(tenant, bad)  # type: ignore[arg-type]
        assert refused.value.field == "weight"
    assert slots.usage(tenant).weight == 2
    slots.set_weight(tenant, None)
    assert slots.usage(tenant).weight == 1


def test_a_fleet_capacity_lowered_below_what_runs_admits_and_wakes_nobody_until_enough_have_left(
    backend: Storage,
) -> None:
    """Capacity 8 (2 a shard) holding [2, 2, 0, 0], redeployed with 4 (1 a shard): shards 2 and 3
    are below their new part, yet the fleet runs 4 already. Lowering kills nothing, and admits
    nobody until the fleet runs fewer than its capacity, as for a tenant's lowered limit."""
    name = _fleet()
    for shard in (0, 1):
        backend.table.update({"pk": fleet_slots.shard_pk(shard, name), "sk": "RUNNING"}, Update(add={"running": 2}))
    slots = backend.slots.with_default(None, fleet_capacity=4, fleet_name=name)
    task = _task(backend, _tenant())
    refused = slots.admit(task, slots.slots_for(task))
    assert refused.outcome == "refused" and refused.slot is not None and refused.slot.fleet
    slots.park(task, refused.slot, "normal")
    assert not slots.has_room(refused.slot) and slots.next_fleet_waiters(4) == []
    assert _fleet_counts(backend, slots) == [2, 2, 0, 0]
    for shard in (0, 1):  # two of them end: the fleet runs 2 of its 4
        backend.table.update({"pk": fleet_slots.shard_pk(shard, name), "sk": "RUNNING"}, Update(add={"running": -1}))
    assert [w[0] for w in slots.next_fleet_waiters(4)] == [task.task_id]  # room for 2, one waits


def test_a_fleet_capacity_lowered_below_what_runs_refuses_a_keyed_task_too(backend: Storage) -> None:
    """The same lowered capacity ([0, 0, 2, 2] running of 4, 1 a shard), for a task with a
    concurrency key: the read lets it through to the transaction (its key is not read), and the
    fleet slot it names is one at or over its part, so the shard refuses it rather than a
    shard below its new part letting it in over the capacity."""
    name = _fleet()
    for shard in (2, 3):
        backend.table.update({"pk": fleet_slots.shard_pk(shard, name), "sk": "RUNNING"}, Update(add={"running": 2}))
    slots = backend.slots.with_default(None, fleet_capacity=4, fleet_name=name)
    for _ in range(3):
        task = _task(backend, _tenant(), key="k", limit=5)
        needed = slots.slots_for(task)
        fleet_slot = next(s for s in needed if s.fleet)
        assert fleet_slot.seen_full and fleet_slot.pk in (fleet_slots.shard_pk(2, name), fleet_slots.shard_pk(3, name))
        refused = slots.admit(task, needed)
        assert refused.outcome == "refused" and refused.slot is not None and refused.slot.fleet
    assert _fleet_counts(backend, slots) == [0, 0, 2, 2]
