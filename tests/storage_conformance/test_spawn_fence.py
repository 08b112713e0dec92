"""A spawn's writes after its record (the children, the record's marks, the folds of the
children's budgets) are fenced by the parent's lease, on every backend (ARCHITECTURE 2): a
zombie parent writes none of them, and the parent's own retry of a child write cut short writes
the same children again without resetting one that ran."""

from __future__ import annotations

import time

import pytest

from agentq.core.errors import LeaseLost
from agentq.core.fanout import ChildPlan
from agentq.core.models import Lease, Task, TaskStatus
from agentq.storage import keys
from agentq.storage.container import Storage

from tests.helpers import scripted
from tests.storage_conformance._builders import claimed, llm_step, usage


def _spawned(backend: Storage, n: int, share: int = 10) -> tuple[Lease, Task, list[ChildPlan]]:
    lease = claimed(backend, max_tokens=10_000)
    parent = backend.tasks.get(lease.task_id)
    plans = [ChildPlan(f"child{i}-{time.time_ns()}", scripted([{"text": "c"}]), share, 60) for i in range(n)]
    assert backend.spawns.create(lease, parent, "sp1", plans, [], n) is True
    return lease, parent, plans


def _run_to_the_end(backend: Storage, child_id: str, used: int) -> None:
    got = backend.tasks.claim(child_id, "w-child", 30)
    assert got is not None
    backend.steps.commit(got[0], 1, llm_step(), root_id=child_id, settle=usage(reserved=0, used=used),
                         finish=TaskStatus.SUCCEEDED, result="ok")  # fmt: skip


def test_a_zombie_parent_writes_no_child_marks_no_record_and_folds_no_budget(backend: Storage) -> None:
    """The parent's worker is taken over after its spawn; the successor settles a child that
    ended. The zombie's rewrite of the children, its mark and its fold are all refused: the
    child that ran keeps its end and its settled budget (no second fold into the parent)."""
    zombie, parent, plans = _spawned(backend, 2)
    backend.tasks.release(zombie)
    successor = backend.tasks.claim(parent.task_id, "w2", 30)
    assert successor is not None
    _run_to_the_end(backend, plans[0].task_id, used=4)
    backend.budgets.settle_child(parent.task_id, plans[0].task_id, lease=successor[0])
    children_before = [backend.table.get(keys.meta_key(p.task_id)) for p in plans]
    parent_budget = backend.budgets.get(parent.task_id)

    with pytest.raises(LeaseLost, match="superseded"):
        backend.spawns.write_children(zombie, parent, "sp1", plans)
    with pytest.raises(LeaseLost, match="superseded"):
        backend.spawns.mark(parent.task_id, "sp1", lease=zombie, execution_arn="arn:zombie")
    with pytest.raises(LeaseLost, match="superseded"):
        backend.budgets.settle_child(parent.task_id, plans[1].task_id, lease=zombie)

    assert [backend.table.get(keys.meta_key(p.task_id)) for p in plans] == children_before
    assert backend.budgets.get(parent.task_id) == parent_budget
    record = backend.spawns.get(parent.task_id, "sp1")
    assert record is not None and record.execution_arn is None
    assert backend.tasks.get(plans[0].task_id).status is TaskStatus.SUCCEEDED
    assert not backend.budgets.get(plans[1].task_id).settled


def test_the_parents_retry_of_its_child_writes_rewrites_fresh_children_and_leaves_one_that_ran(
    backend: Storage,
) -> None:
    """The parent's own worker writes the children again (a resume of a ``creating`` spawn, or a
    retried transaction that had gone through): the children nothing has touched are written as
    they were, the one already claimed is left as it is (never back to ``queued``, step 0)."""
    lease, parent, plans = _spawned(backend, 3)
    got = backend.tasks.claim(plans[1].task_id, "w-child", 30)
    assert got is not None
    claimed_before = backend.table.get(keys.meta_key(plans[1].task_id))

    backend.spawns.write_children(lease, parent, "sp1", plans)

    assert backend.table.get(keys.meta_key(plans[1].task_id)) == claimed_before
    fresh = backend.tasks.get_many([plans[0].task_id, plans[2].task_id])
    assert [(c.status, c.claim_count, c.parent_id) for c in fresh] == [(TaskStatus.QUEUED, 0, parent.task_id)] * 2
    assert [backend.budgets.get(c.task_id).cap for c in fresh] == [10, 10]
    record = backend.spawns.get(parent.task_id, "sp1")
    assert record is not None and record.state == "created"


def test_children_past_one_transaction_are_written_in_chunks_each_with_the_parents_fence(backend: Storage) -> None:
    """50 children are 100 actions: with the fence's check in each chunk, 49 children a chunk
    (DynamoDB refuses a transaction of more than 100 actions)."""
    lease, parent, plans = _spawned(backend, 50)
    children = backend.tasks.get_many([p.task_id for p in plans])
    assert len(children) == 50 and all(c.parent_id == parent.task_id for c in children)
    record = backend.spawns.get(parent.task_id, "sp1")
    assert record is not None and record.state == "created"
    assert backend.budgets.get(parent.task_id).reserved == 500
    del lease
