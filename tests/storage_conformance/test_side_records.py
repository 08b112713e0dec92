"""Effects, notes, approvals, spawns, tenant windows and purge on every backend."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentq.core.endusers import NotTheApprover
from agentq.core.errors import BudgetExceeded, IllegalTransition, LeaseLost, TaskNotFound
from agentq.core.fanout import ChildPlan
from agentq.core.models import TaskStatus, ToolOutcome
from agentq.core.tenancy import TenantCapReached, TenantLimits
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.table import Update

from tests.helpers import scripted
from tests.storage_conformance._builders import claimed, llm_step, new_task


def _outcome(content: str) -> ToolOutcome:
    return ToolOutcome(
        tool_use_id="tu1", name="charge", content=content, side_effects=True, started_at=time.time(), duration_ms=1
    )


def test_a_side_effect_begins_once_and_its_result_is_found_by_the_next_worker(backend: Storage) -> None:
    lease = claimed(backend)
    assert backend.effects.begin(lease, "tu1", "charge") is None
    started = backend.effects.begin(lease, "tu1", "charge")
    assert started is not None and started.state == "started" and started.content is None
    backend.effects.finish(lease, "tu1", _outcome("charged"))
    done = backend.effects.get(lease.task_id, "tu1")
    assert done is not None and done.state == "done" and done.content == "charged" and not done.is_error


def test_a_zombie_can_neither_begin_nor_finish_an_effect_nor_write_a_note(backend: Storage) -> None:
    lease = claimed(backend)
    backend.tasks.release(lease)
    assert backend.tasks.claim(lease.task_id, "w2", 30) is not None
    with pytest.raises(LeaseLost):
        backend.effects.begin(lease, "tu9", "charge")
    with pytest.raises(LeaseLost):
        backend.effects.finish(lease, "tu9", _outcome("x"))
    with pytest.raises(LeaseLost):
        backend.notes.write(lease, "k", "v")
    assert backend.effects.get(lease.task_id, "tu9") is None and backend.notes.read(lease.task_id, "k") is None


def test_notes_read_back(backend: Storage) -> None:
    lease = claimed(backend)
    backend.notes.write(lease, "plan", "step one")
    assert (
        backend.notes.read(lease.task_id, "plan") == "step one" and backend.notes.read(lease.task_id, "other") is None
    )


def test_an_approval_pauses_the_task_and_is_decided_once(backend: Storage) -> None:
    lease = claimed(backend)
    backend.approvals.request(lease, "tu1", "ship it?")
    assert backend.tasks.get(lease.task_id).status is TaskStatus.PAUSED
    pending = backend.approvals.pending(lease.task_id)
    assert pending is not None and pending.use_id == "tu1" and pending.question == "ship it?"
    backend.approvals.decide(lease.task_id, "tu1", approved=False, note="no", by="ann")
    decided = backend.approvals.get(lease.task_id, "tu1")
    assert decided is not None and decided.state == "rejected" and decided.decided_by == "ann"
    assert backend.tasks.get(lease.task_id).status is TaskStatus.QUEUED
    with pytest.raises(IllegalTransition):
        backend.approvals.decide(lease.task_id, "tu1", approved=True, note="", by="bob")
    assert backend.approvals.pending(lease.task_id) is None


def test_a_decision_request_stays_bound_to_the_call_it_first_arrived_at_and_knows_its_own_decision(
    backend: Storage,
) -> None:
    """``bind`` is a conditional put: a request's key bound to one call is never rebound to the
    call held next, and ``decided_with`` tells a retry of the request that decided a call from
    another request (A2A's text 'approve', api/a2a_server._decide)."""
    lease = claimed(backend)
    backend.approvals.request(lease, "tu1", "ship it?")
    assert backend.approvals.bound(lease.task_id, "k1") is None
    assert backend.approvals.bind(lease.task_id, "k1", "tu1") == "tu1"
    backend.approvals.decide(lease.task_id, "tu1", approved=True, note="", by="ann", key="k1")
    assert backend.approvals.decided_with(lease.task_id, "tu1", "k1")
    assert not backend.approvals.decided_with(lease.task_id, "tu1", "k2")
    again = backend.tasks.claim(lease.task_id, "w1", 30)
    assert again is not None
    backend.approvals.request(again[0], "tu2", "drop the database?")
    assert backend.approvals.bind(lease.task_id, "k1", "tu2") == "tu1"  # a retry: still the first call
    assert backend.approvals.bound(lease.task_id, "k1") == "tu1"
    assert backend.approvals.bind(lease.task_id, "k2", "tu2") == "tu2"


def test_a_tokens_decision_of_an_approval_only_the_tenant_decides_writes_nothing(backend: Storage) -> None:
    """The write itself is conditioned on who may decide (not only the control plane's check
    before it): a decision by an end user's token of a ``tenant`` approval is ``NotTheApprover``
    and leaves it pending and the task paused; a ``user`` one, and a record from before
    approvers (none stored), its token decides."""
    lease = claimed(backend)
    backend.approvals.request(lease, "tu1", "refund 500?", approver="tenant")
    with pytest.raises(NotTheApprover):
        backend.approvals.decide(lease.task_id, "tu1", approved=True, note="mine", by="t", by_user="mallory")
    pending = backend.approvals.pending(lease.task_id)
    assert pending is not None and pending.approver == "tenant" and pending.decided_by is None
    assert backend.tasks.get(lease.task_id).status is TaskStatus.PAUSED
    backend.approvals.decide(lease.task_id, "tu1", approved=True, note="ops", by="t")  # the tenant's key
    assert backend.tasks.get(lease.task_id).status is TaskStatus.QUEUED
    for approver in ("user", None):
        mine = claimed(backend)
        backend.approvals.request(mine, "tu2", "send it?", approver="user")
        if approver is None:  # as a record asked before approvers existed was stored
            key = keys.item_key(mine.task_id, f"{keys.APPROVAL}tu2")
            backend.approvals.table.update(key, Update(remove=["approver"]))
            legacy = backend.approvals.pending(mine.task_id)
            assert legacy is not None and legacy.approver == "user"  # who could decide it when it was asked
        backend.approvals.decide(mine.task_id, "tu2", approved=True, note="", by="t", by_user="mallory")
        decided = backend.approvals.get(mine.task_id, "tu2")
        assert decided is not None and decided.state == "approved" and decided.decided_by_user == "mallory"


def _plans(store: Storage, n: int, share: int) -> list[ChildPlan]:
    return [ChildPlan(f"child{i}-{time.time_ns()}", scripted([{"text": "c"}]), share, 60) for i in range(n)]


def test_a_spawn_funds_its_children_once_and_writes_them(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    parent = backend.tasks.get(lease.task_id)
    plans = _plans(backend, 40, 20)
    assert backend.spawns.create(lease, parent, "sp1", plans, [], 5) is True
    assert backend.spawns.create(lease, parent, "sp1", plans, [], 5) is False
    record = backend.spawns.get(parent.task_id, "sp1")
    assert record is not None and record.state == "created" and len(record.children) == 40 and len(record.plans) == 40
    children = backend.tasks.get_many(record.children)
    assert len(children) == 40 and all(c.parent_id == parent.task_id and c.depth == 1 for c in children)
    budget = backend.budgets.get(parent.task_id)
    assert (budget.available, budget.reserved) == (200, 800)
    assert backend.budgets.get(children[0].task_id).cap == 20


def test_a_spawn_the_budget_cannot_fund_writes_nothing(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=100)
    parent = backend.tasks.get(lease.task_id)
    with pytest.raises(BudgetExceeded):
        backend.spawns.create(lease, parent, "sp1", _plans(backend, 3, 50), [], 3)
    assert backend.spawns.get(parent.task_id, "sp1") is None and backend.budgets.get(parent.task_id).available == 100


def test_a_zombie_parent_spawns_nothing_and_takes_no_shares(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    parent = backend.tasks.get(lease.task_id)
    backend.tasks.release(lease)
    assert backend.tasks.claim(lease.task_id, "w2", 30) is not None
    with pytest.raises(LeaseLost, match="superseded"):
        backend.spawns.create(lease, parent, "sp1", _plans(backend, 2, 50), [], 2)
    assert backend.spawns.get(parent.task_id, "sp1") is None and backend.budgets.get(parent.task_id).available == 1000


def test_a_child_budget_folds_into_its_parent_once(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    parent = backend.tasks.get(lease.task_id)
    plans = _plans(backend, 1, 300)
    backend.spawns.create(lease, parent, "sp1", plans, [], 1)
    child = backend.tasks.claim(plans[0].task_id, "w2", 30)
    assert child is not None
    from tests.storage_conformance._builders import usage

    backend.steps.commit(child[0], 1, llm_step(), root_id=plans[0].task_id, settle=usage(reserved=0, used=120))
    backend.budgets.settle_child(parent.task_id, plans[0].task_id)
    backend.budgets.settle_child(parent.task_id, plans[0].task_id)
    budget = backend.budgets.get(parent.task_id)
    assert (budget.used, budget.reserved, budget.available) == (120, 0, 880)


def test_a_tenant_window_refuses_past_its_hourly_cap_and_settles_to_usage(backend: Storage) -> None:
    limits = TenantLimits(hourly_tokens=1000)
    first = backend.windows.hold("acme", limits, 800)
    with pytest.raises(TenantCapReached):
        backend.windows.hold("acme", limits, 300)
    backend.windows.settle(first, 100)
    assert backend.windows.usage("acme") == {"held": 100, "used": 100}  # held counts what was used too
    backend.windows.hold("acme", limits, 300)
    backend.windows.set_limits("acme", limits)
    assert backend.windows.limits("acme") == limits and backend.windows.limits("other") is None


def test_purge_refuses_a_live_task_and_deletes_a_finished_one_whole_twice_over(backend: Storage) -> None:
    lease = claimed(backend)
    neighbour = new_task(backend)
    backend.steps.commit(lease, 1, llm_step(text="y" * 70_000), root_id=lease.task_id)
    with pytest.raises(IllegalTransition):
        backend.purge.task(lease.task_id)
    backend.tasks.transition(lease.task_id, TaskStatus.SUCCEEDED, lease=lease, result="ok")
    done = backend.purge.task(lease.task_id)
    assert done.items == 5 and done.objects == 1  # META (with the budget), submission, claim, step, event
    assert backend.steps.raw_items(lease.task_id) == []
    with pytest.raises(TaskNotFound):
        backend.budgets.get(lease.task_id)
    again = backend.purge.task(lease.task_id)
    assert (again.items, again.objects) == (0, 0)
    assert backend.tasks.get(neighbour).status is TaskStatus.QUEUED


def _folded_with_a_live_lapsed_hold(backend: Storage) -> tuple[str, str, Any]:
    """A child killed mid call (epoch 1, hold 200), finished by its successor, folded into its
    parent while the lapsed hold was still counted: the parent took it as spent."""
    lease = claimed(backend, max_tokens=1000)
    parent = backend.tasks.get(lease.task_id)
    plans = _plans(backend, 1, 300)
    backend.spawns.create(lease, parent, "sp1", plans, [], 1)
    child_id = plans[0].task_id
    first = backend.tasks.claim(child_id, "w2", 30)
    assert first is not None
    held = backend.budgets.reserve(first[0], child_id, 200, 1, until=time.time() + 60)
    backend.tasks.release(first[0])
    second = backend.tasks.claim(child_id, "w3", 30)
    assert second is not None
    backend.budgets.set_aside(second[0], held)
    from tests.storage_conformance._builders import usage

    backend.steps.commit(second[0], 1, llm_step(), root_id=child_id, settle=usage(reserved=0, used=50),
                         finish=TaskStatus.SUCCEEDED, result="ok")  # fmt: skip
    backend.budgets.settle_child(parent.task_id, child_id)
    assert backend.budgets.get(parent.task_id).used == 250  # 50 used + the 200 hold, as if spent
    return parent.task_id, child_id, held


def test_a_lapsed_hold_past_its_deadline_after_its_child_was_folded_stays_spent_in_the_parent(
    backend: Storage,
) -> None:
    parent_id, child_id, held = _folded_with_a_live_lapsed_hold(backend)
    assert backend.budgets.spend_lapsed(child_id, child_id, held, parent_id=parent_id) is True
    assert backend.budgets.spend_lapsed(child_id, child_id, held, parent_id=parent_id) is False
    budget = backend.budgets.get(parent_id)
    assert (budget.used, budget.reserved, budget.available) == (250, 0, 750)  # its outcome is unknown: spent
    child = backend.budgets.get(child_id)
    assert (child.used, child.reserved) == (250, 0)


def test_a_child_call_reported_after_its_hold_was_spent_and_folded_corrects_the_parent_once(
    backend: Storage,
) -> None:
    parent_id, child_id, held = _folded_with_a_live_lapsed_hold(backend)
    from tests.storage_conformance._builders import usage

    backend.budgets.spend_lapsed(child_id, child_id, held, parent_id=parent_id)
    late = usage(reserved=200, used=120)
    assert backend.budgets.settle_orphan(child_id, child_id, late, inflight_epoch=1, parent_id=parent_id) is True
    budget = backend.budgets.get(parent_id)
    assert (budget.used, budget.reserved, budget.available) == (170, 0, 830)  # what the calls really used


def test_a_zombie_child_call_answered_after_the_fold_charges_the_parent_what_it_used(backend: Storage) -> None:
    parent_id, child_id, _ = _folded_with_a_live_lapsed_hold(backend)
    from tests.storage_conformance._builders import usage

    late = usage(reserved=200, used=120)
    assert backend.budgets.settle_orphan(child_id, child_id, late, inflight_epoch=1, parent_id=parent_id) is True
    budget = backend.budgets.get(parent_id)
    assert (budget.used, budget.reserved, budget.available) == (170, 0, 830)
