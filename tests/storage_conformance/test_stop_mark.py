"""A stop's mark on META (``STOPPING``, ``TaskTransitions.mark_stopping``) on both backends: it
fences every write a worker makes for its task as a cancel does, it is refused only by a task
that may no longer be cancelled, and it does not outlive the task's next status change or claim
(ARCHITECTURE invariant 17)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from agentq.core.errors import IllegalTransition, LeaseLost
from agentq.core.models import Lease, RetryState, TaskStatus, ToolOutcome
from agentq.core.reservation import Reservation
from agentq.core.workspace import WorkspaceRef
from agentq.storage.container import Storage
from agentq.storage.table import STOPPING

from ._builders import claimed, llm_step, new_task

SCOPE = "user 'alice'"


def _retry() -> RetryState:
    now = time.time()
    return RetryState(step=1, scope="call", attempt=1, max_attempts=3, code="rate_limited", message="429",
                      at=now, next_at=now + 1)  # fmt: skip


def _worker_writes(backend: Storage, lease: Lease, held: Reservation) -> dict[str, Callable[[], object]]:
    """The kinds of write a worker makes for its task under its lease (``WRITES``): META's,
    and those of other items that check META's fence in the same transaction. ``held``: a hold
    reserved (and side effect ``tu0`` begun) before the mark."""
    task_id = lease.task_id
    done = ToolOutcome(tool_use_id="tu0", name="pay", content="paid", started_at=time.time(), duration_ms=1)
    writes: dict[str, Callable[[], object]] = {
        "step commit": lambda: backend.steps.commit(lease, 1, llm_step(), root_id=task_id),
        "heartbeat": lambda: backend.tasks.extend_lease(lease, 30),
        "its own ending": lambda: backend.tasks.transition(task_id, TaskStatus.SUCCEEDED, lease=lease, result="ok"),
        "a pause for a batch": lambda: backend.tasks.transition(task_id, TaskStatus.WAITING, lease=lease),
        "a retry's record": lambda: backend.tasks.record_retry(task_id, _retry(), lease=lease),
        "a side effect's start": lambda: backend.effects.begin(lease, "tu1", "pay"),
        "a note": lambda: backend.notes.write(lease, "k", "v"),
        "a hold's reserve": lambda: backend.budgets.reserve(lease, task_id, 100, 1),
        "a hold's extension (before its call)": lambda: backend.budgets.extend_hold(lease, held, time.time() + 60),
        "a side effect's outcome": lambda: backend.effects.finish(lease, "tu0", done),
        "a streamed call's live text": lambda: backend.tasks.publish_live_text(lease, "partial answer"),
        "a workspace's start": lambda: backend.tasks.start_workspace(lease, WorkspaceRef(manifest="m" * 64)),
    }
    assert tuple(writes) == WRITES
    return writes


WRITES = ("step commit", "heartbeat", "its own ending", "a pause for a batch", "a retry's record",
          "a side effect's start", "a note", "a hold's reserve", "a hold's extension (before its call)",
          "a side effect's outcome", "a streamed call's live text", "a workspace's start")  # fmt: skip


@pytest.mark.parametrize("write", WRITES)
def test_a_marked_tasks_worker_writes_nothing_and_is_told_its_task_is_being_stopped_not_ended(
    backend: Storage, write: str
) -> None:
    lease = claimed(backend)
    held = backend.budgets.reserve(lease, lease.task_id, 50, 1, until=time.time() + 30)
    assert backend.effects.begin(lease, "tu0", "pay") is None
    before = backend.tasks.metas([lease.task_id])[0]
    assert backend.tasks.mark_stopping([lease.task_id], SCOPE) == [True]
    with pytest.raises(LeaseLost) as lost:
        _worker_writes(backend, lease, held)[write]()
    assert lost.value.details == {"stopping": SCOPE}  # the worker lets it go; the task has not ended
    assert "status" not in lost.value.details
    after = backend.tasks.metas([lease.task_id])[0]
    assert (after["status"], after["step"], after.get("seq", 0)) == ("running", before["step"], before.get("seq", 0))
    assert backend.effects.get(lease.task_id, "tu1") is None
    effect = backend.effects.get(lease.task_id, "tu0")
    assert effect is not None and effect.state == "started"
    assert backend.notes.read(lease.task_id, "k") is None
    assert after["inflight"] == before["inflight"]
    assert all(name not in after for name in ("live_text", "workspace_start"))


def test_a_mark_is_refused_only_by_a_task_that_can_no_longer_be_cancelled(backend: Storage) -> None:
    """A batch marks its queued and running tasks though one of them ended since it was listed
    (a transaction names the one it refused, and the rest are marked without it)."""
    running = claimed(backend).task_id
    queued = new_task(backend)
    ended = claimed(backend)
    backend.steps.commit(ended, 1, llm_step(text="done"), root_id=ended.task_id, finish=TaskStatus.SUCCEEDED,
                         result="done")  # fmt: skip
    assert backend.tasks.mark_stopping([running, ended.task_id, queued], SCOPE) == [True, False, True]
    marks = {m["task_id"]: m.get(STOPPING) for m in backend.tasks.metas([running, ended.task_id, queued])}
    assert marks == {running: SCOPE, ended.task_id: None, queued: SCOPE}


def test_the_move_to_cancelled_takes_the_mark_off_and_so_does_any_status_change(backend: Storage) -> None:
    cancelled, requeued = claimed(backend).task_id, claimed(backend).task_id
    backend.tasks.mark_stopping([cancelled, requeued], SCOPE)
    backend.tasks.transition(cancelled, TaskStatus.CANCELLED, error={"code": "cancelled", "message": "stopped"})
    backend.tasks.transition(requeued, TaskStatus.QUEUED)
    assert all(STOPPING not in m for m in backend.tasks.metas([cancelled, requeued]))


def test_a_worker_refused_by_a_mark_gives_its_lease_back_and_the_next_claim_takes_the_mark_off(
    backend: Storage,
) -> None:
    """A worker refused by a mark gives its lease back (a release is not refused: it writes
    nothing of the task's) and its delivery comes back a few seconds later
    (``engine.result.STOPPING_LOOK_AGAIN_SECONDS``). When the stop died before its move and the
    scope was resumed, that delivery's claim (made after it read the stops) takes the task at
    once, takes the mark off, and its steps commit: the task is not stuck."""
    task_id = new_task(backend)
    first = backend.tasks.claim(task_id, "w1", 600)
    assert first is not None
    backend.tasks.mark_stopping([task_id], SCOPE)
    with pytest.raises(LeaseLost):
        backend.steps.commit(first[0], 1, llm_step(), root_id=task_id)
    backend.tasks.release(first[0])
    retaken = backend.tasks.claim(task_id, "w2", 600)
    assert retaken is not None
    backend.steps.commit(retaken[0], 1, llm_step(), root_id=task_id)
    meta = backend.tasks.metas([task_id])[0]
    assert int(meta["step"]) == 1 and STOPPING not in meta


@pytest.mark.parametrize("write", WRITES)
def test_a_cancelled_tasks_worker_writes_nothing_and_is_told_its_task_ended(backend: Storage, write: str) -> None:
    """A cancel (and a stop's move to ``cancelled``, which takes its mark off) moves no epoch: the
    fence's ``running`` is what refuses the worker, the lease's own writes included."""
    lease = claimed(backend)
    held = backend.budgets.reserve(lease, lease.task_id, 50, 1, until=time.time() + 30)
    assert backend.effects.begin(lease, "tu0", "pay") is None
    backend.tasks.transition(lease.task_id, TaskStatus.CANCELLED, error={"code": "cancelled", "message": "by hand"})
    before = backend.tasks.metas([lease.task_id])[0]
    with pytest.raises((LeaseLost, IllegalTransition)) as refused:
        _worker_writes(backend, lease, held)[write]()
    if isinstance(refused.value, LeaseLost):
        assert refused.value.details.get("status") is TaskStatus.CANCELLED, refused.value
    else:  # its own ending, a pause: a move a cancelled task may not make
        assert "'cancelled'" in str(refused.value)
    after = backend.tasks.metas([lease.task_id])[0]
    assert {k: v for k, v in after.items() if k != "updated_at"} == {
        k: v for k, v in before.items() if k != "updated_at"
    }
    assert backend.effects.get(lease.task_id, "tu1") is None
    assert backend.notes.read(lease.task_id, "k") is None
