"""Illegal transitions are refused by the store's DynamoDB condition, not by caller discipline."""

from __future__ import annotations

import pytest

from agentq.core.errors import IllegalTransition, LeaseLost
from agentq.core.models import ALLOWED_TRANSITIONS, REOPENED_BY_MESSAGE, TERMINAL_STATUSES, TaskStatus
from agentq.storage.container import Storage

from tests.helpers import scripted


def _task(store: Storage) -> str:
    return store.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id


def test_terminal_states_lead_nowhere_but_requeue_for_failed_cost_exceeded_and_a_follow_up() -> None:
    for status in TERMINAL_STATUSES:
        allowed = ALLOWED_TRANSITIONS[status]
        if status in (TaskStatus.FAILED, TaskStatus.COST_EXCEEDED, TaskStatus.SUCCEEDED):
            assert allowed == {TaskStatus.QUEUED}
        else:
            assert allowed == frozenset()
    assert {TaskStatus.SUCCEEDED, TaskStatus.IDLE} == REOPENED_BY_MESSAGE  # only a message takes these edges


@pytest.mark.parametrize("target", [TaskStatus.SUCCEEDED, TaskStatus.COST_EXCEEDED, TaskStatus.WAITING])
def test_a_queued_task_cannot_jump_to_states_only_a_running_task_reaches(store: Storage, target: TaskStatus) -> None:
    task_id = _task(store)
    with pytest.raises(IllegalTransition, match="cannot move from 'queued'"):
        store.tasks.transition(task_id, target)
    assert store.tasks.get(task_id).status is TaskStatus.QUEUED


def test_a_queued_task_may_be_timed_out_keeping_the_result_and_error_it_is_given(store: Storage) -> None:
    """A sub-agent still queued (parked for a slot) when its parent's fan-out gives up on it
    ends ``timed_out`` there (``control.subtrees.time_out_subagent``): its parent is told so, and
    it must never run after that. The move was illegal: the parent was told ``timed_out`` while
    the child stayed queued and ran later."""
    task_id = _task(store)
    error = {"code": "timeout", "message": "sub-agent deadline passed"}
    assert store.tasks.transition(task_id, TaskStatus.TIMED_OUT, result=None, error=error) == "queued"
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.TIMED_OUT and task.error == error and task.finished_at is not None
    assert store.tasks.claim(task_id, "w", 30) is None  # nothing runs it any more


def test_a_succeeded_task_cannot_be_cancelled_or_requeued(store: Storage) -> None:
    task_id = _task(store)
    lease, _ = store.tasks.claim(task_id, "w", 30)  # type: ignore[misc]
    store.tasks.transition(task_id, TaskStatus.SUCCEEDED, lease=lease, result="ok")
    for target in (TaskStatus.CANCELLED, TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.FAILED):
        with pytest.raises(IllegalTransition):
            store.tasks.transition(task_id, target)
    final = store.tasks.get(task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "ok"


def test_legal_transitions_apply_and_are_recorded(store: Storage) -> None:
    task_id = _task(store)
    store.tasks.transition(task_id, TaskStatus.CANCELLED)
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.CANCELLED and task.finished_at is not None


def test_a_transition_with_a_stale_lease_is_fenced(store: Storage) -> None:
    task_id = _task(store)
    old, _ = store.tasks.claim(task_id, "a", 0.01)  # type: ignore[misc]
    import time

    time.sleep(0.05)
    new, _ = store.tasks.claim(task_id, "b", 30)  # type: ignore[misc]
    assert new.epoch == old.epoch + 1
    with pytest.raises(LeaseLost):
        store.tasks.transition(task_id, TaskStatus.SUCCEEDED, lease=old, result="zombie")
    with pytest.raises(LeaseLost):
        store.tasks.extend_lease(old, 30)
    assert store.tasks.get(task_id).status is TaskStatus.RUNNING
    store.tasks.transition(task_id, TaskStatus.SUCCEEDED, lease=new, result="real")
    assert store.tasks.get(task_id).result == "real"


def test_a_large_result_is_stored_in_s3_and_read_back(store: Storage) -> None:
    task_id = _task(store)
    lease, _ = store.tasks.claim(task_id, "w", 30)  # type: ignore[misc]
    big = "r" * 200_000
    store.tasks.transition(task_id, TaskStatus.SUCCEEDED, lease=lease, result=big)
    item = next(i for i in store.steps.raw_items(task_id) if i["sk"]["S"] == "META")
    assert "result_ref" in item and "result" not in item
    assert store.tasks.get(task_id).result == big
