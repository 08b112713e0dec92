"""Tasks, leases and transitions behave the same on every backend."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agentq.core.errors import IdempotencyConflict, IllegalTransition, LeaseLost, TaskNotFound
from agentq.core.models import RetryState, TaskStatus, TaskSubmission
from agentq.core.workspace import WorkspaceRef, WorkspaceStartRefused
from agentq.observe.redaction import REDACTOR
from agentq.storage import keys
from agentq.storage.budget_items import BudgetRaise
from agentq.storage.container import Storage
from agentq.storage.item_size import item_size
from agentq.storage.table import ConditionFailed, IdempotentParameterMismatch, TransactionCancelled, Update
from agentq.storage.tasks import FORK_PENDING, FORK_PENDING_SECONDS

from tests.helpers import scripted
from tests.storage_conformance._builders import claimed, llm_step, new_task


def test_a_created_task_reads_back_queued_with_its_submission_and_budget(backend: Storage) -> None:
    task_id = new_task(backend, max_tokens=1234)
    task = backend.tasks.get(task_id)
    assert task.status is TaskStatus.QUEUED and task.submission.goal == "test goal" and task.root_id == task_id
    assert backend.budgets.get(task_id).cap == 1234 and backend.budgets.get(task_id).available == 1234


def test_an_unknown_task_is_not_found(backend: Storage) -> None:
    with pytest.raises(TaskNotFound):
        backend.tasks.get("nope")
    assert backend.tasks.get_many(["nope"]) == []


def test_a_task_id_is_never_created_twice(backend: Storage) -> None:
    backend.tasks.create(scripted([{"text": "x"}]), tenant="t", task_id="fixed")
    # The same id is the same transaction token: DynamoDB refuses it as a different request.
    with pytest.raises((TransactionCancelled, IdempotentParameterMismatch)):
        backend.tasks.create(scripted([{"text": "y"}]), tenant="t2", task_id="fixed")
    assert backend.tasks.get("fixed").tenant == "t"


def test_one_claim_wins_and_a_live_lease_refuses_the_next(backend: Storage) -> None:
    task_id = new_task(backend)
    first = backend.tasks.claim(task_id, "w1", 30)
    assert first is not None and first[0].epoch == 1 and first[1].status is TaskStatus.RUNNING
    assert backend.tasks.claim(task_id, "w2", 30) is None
    assert [c.worker for c in backend.tasks.claims(task_id)] == ["w1"]


def test_a_lapsed_lease_is_taken_over_with_the_next_epoch_and_fences_the_old_holder(backend: Storage) -> None:
    task_id = new_task(backend)
    old = backend.tasks.claim(task_id, "w1", 0.05)
    assert old is not None
    time.sleep(0.1)
    new = backend.tasks.claim(task_id, "w2", 30)
    assert new is not None and new[0].epoch == 2 and new[1].claim_count == 2
    with pytest.raises(LeaseLost):
        backend.tasks.extend_lease(old[0], 30)
    with pytest.raises(LeaseLost):
        backend.tasks.transition(task_id, TaskStatus.SUCCEEDED, lease=old[0], result="zombie")
    claims = backend.tasks.claims(task_id)
    assert [(c.epoch, c.worker) for c in claims] == [(1, "w1"), (2, "w2")]
    assert claims[1].prev_heartbeat_at is not None and backend.tasks.get(task_id).last_resume_gap is not None


def test_only_a_claim_that_takes_over_a_run_in_progress_counts_as_a_resume(backend: Storage) -> None:
    # A run that ends and is queued again by a follow-up starts a new run: no resume, no resume
    # gap (it would measure how long the conversation sat answered). A lapsed lease taken over,
    # and a run handed on (released while running), are resumes, each counted once.
    task_id = new_task(backend)
    first = backend.tasks.claim(task_id, "w1", 30)
    assert first is not None and first[1].resume_count == 0
    backend.tasks.transition(task_id, TaskStatus.SUCCEEDED, lease=first[0], result="answer")
    assert backend.messages.accept(task_id, "and then?").status is TaskStatus.QUEUED
    follow_up = backend.tasks.claim(task_id, "w2", 0.05)
    assert follow_up is not None and follow_up[1].claim_count == 2
    task = backend.tasks.get(task_id)
    assert (task.resume_count, task.claimed_from, task.last_resume_gap) == (0, TaskStatus.QUEUED, None)
    time.sleep(0.1)
    taken = backend.tasks.claim(task_id, "w3", 30)
    assert taken is not None and taken[1].resume_count == 1
    task = backend.tasks.get(task_id)
    assert (task.resume_count, task.claimed_from) == (1, TaskStatus.RUNNING) and task.last_resume_gap is not None
    backend.tasks.release(taken[0])  # a continuation or a shutdown hands the run on
    handed = backend.tasks.claim(task_id, "w4", 30)
    assert handed is not None and handed[1].resume_count == 2 and backend.tasks.get(task_id).claim_count == 4


def test_a_released_lease_may_be_claimed_at_once_and_is_not_revived_by_an_extension(backend: Storage) -> None:
    lease = claimed(backend)
    backend.tasks.release(lease)
    with pytest.raises(LeaseLost):
        backend.tasks.extend_lease(lease, 30)
    assert backend.tasks.claim(lease.task_id, "w2", 30) is not None


@pytest.mark.parametrize("target", [TaskStatus.SUCCEEDED, TaskStatus.WAITING, TaskStatus.COST_EXCEEDED])
def test_an_illegal_transition_is_refused_and_changes_nothing(backend: Storage, target: TaskStatus) -> None:
    task_id = new_task(backend)
    with pytest.raises(IllegalTransition, match="cannot move from 'queued'"):
        backend.tasks.transition(task_id, target)
    assert backend.tasks.get(task_id).status is TaskStatus.QUEUED


def test_a_terminal_status_stamps_the_expiry_and_a_requeue_clears_it_and_the_error(backend: Storage) -> None:
    lease = claimed(backend)
    backend.tasks.transition(lease.task_id, TaskStatus.FAILED, lease=lease, error={"code": "x", "message": "boom"})
    failed = backend.tasks.get(lease.task_id)
    assert failed.expires_at is not None and failed.error == {"code": "x", "message": "boom"} and failed.finished_at
    backend.tasks.transition(lease.task_id, TaskStatus.QUEUED)
    requeued = backend.tasks.get(lease.task_id)
    assert requeued.expires_at is None and requeued.error is None and requeued.finished_at is None


def test_a_requeue_out_of_one_failure_is_refused_once_the_task_failed_again_and_changes_nothing(
    backend: Storage,
) -> None:
    """A redrive requeues a task out of the failure it was dead-lettered for (``expect``), so a
    copy of it that comes back after a later failure leaves that failure as it is."""
    lease = claimed(backend)
    backend.tasks.transition(lease.task_id, TaskStatus.FAILED, lease=lease, extra={"dead_letter": "first"})
    backend.tasks.transition(lease.task_id, TaskStatus.QUEUED, error=None, expect={"dead_letter": "first"})
    again = backend.tasks.claim(lease.task_id, "w2", 30)
    assert again is not None
    backend.tasks.transition(lease.task_id, TaskStatus.FAILED, lease=again[0], error={"code": "x", "message": "again"},
                             extra={"dead_letter": "second"})  # fmt: skip
    failed = backend.tasks.get(lease.task_id)
    with pytest.raises(IllegalTransition, match="no longer as it was expected"):
        backend.tasks.transition(lease.task_id, TaskStatus.QUEUED, error=None, expect={"dead_letter": "first"})
    assert backend.tasks.get(lease.task_id) == failed
    backend.tasks.transition(lease.task_id, TaskStatus.QUEUED, error=None, expect={"dead_letter": "second"})
    assert backend.tasks.get(lease.task_id).status is TaskStatus.QUEUED


def test_a_requeue_out_of_a_dead_lettered_failure_leaves_no_failure_for_a_copy_of_its_redrive_to_match(
    backend: Storage,
) -> None:
    """The requeue takes the task out of the failure it was dead-lettered for: once the task fails
    again without a dead letter (a 400, nothing to the DLQ), a copy of the redriven message,
    which expects the first failure, is refused and changes nothing."""
    lease = claimed(backend)
    backend.tasks.transition(lease.task_id, TaskStatus.FAILED, lease=lease, extra={"dead_letter": "first"})
    backend.tasks.transition(lease.task_id, TaskStatus.QUEUED, error=None, expect={"dead_letter": "first"})
    again = backend.tasks.claim(lease.task_id, "w2", 30)
    assert again is not None
    backend.tasks.transition(lease.task_id, TaskStatus.FAILED, lease=again[0], error={"code": "invalid_request"})
    failed = backend.tasks.get(lease.task_id)
    with pytest.raises(IllegalTransition, match="no longer as it was expected"):
        backend.tasks.transition(lease.task_id, TaskStatus.QUEUED, error=None, expect={"dead_letter": "first"})
    assert backend.tasks.get(lease.task_id) == failed


def test_a_large_result_goes_to_the_payload_store_and_reads_back(backend: Storage) -> None:
    lease = claimed(backend)
    big = "r" * 100_000
    backend.tasks.transition(lease.task_id, TaskStatus.SUCCEEDED, lease=lease, result=big)
    assert backend.tasks.get(lease.task_id).result == big


@pytest.mark.parametrize("size", [10, 100_000])  # inline, and in the payload store
def test_the_first_end_a_task_leaves_is_kept_and_no_later_end_replaces_it(backend: Storage, size: int) -> None:
    """The write that first reopens an ended task (a follow-up message here, then a redrive: a
    reopening transition) keeps the end it leaves (``FIRSTEND``: what an MCP task handle answers
    from then on), and none that reopens a later end replaces it."""
    first, second = "1" * size, "2" * size
    lease = claimed(backend)
    task_id = lease.task_id
    backend.tasks.transition(task_id, TaskStatus.SUCCEEDED, lease=lease, result=first)
    ended = backend.tasks.get(task_id)
    assert ended.first_ended_at is None and backend.tasks.first_end(ended) is None  # never reopened
    backend.messages.accept(task_id, "and then?")
    for status, error in ((TaskStatus.FAILED, {"code": "x", "message": "boom"}), (TaskStatus.SUCCEEDED, None)):
        got = backend.tasks.claim(task_id, "w2", 30)
        assert got is not None
        backend.tasks.transition(task_id, status, lease=got[0], result=second, error=error)
        if status is TaskStatus.FAILED:
            backend.tasks.transition(task_id, TaskStatus.QUEUED, error=None, reopen=True)  # a redrive
        else:
            backend.messages.accept(task_id, "and then again?")
        task = backend.tasks.get(task_id)
        kept = backend.tasks.first_end(task)
        assert task.first_ended_at == ended.finished_at and task.result == second
        assert kept is not None and (kept.status, kept.result, kept.error) == (TaskStatus.SUCCEEDED, first, None)
        assert kept.finished_at == ended.finished_at


def test_an_idempotency_key_creates_one_task_and_refuses_another_body(backend: Storage) -> None:
    sub = scripted([{"text": "x"}])
    first, created = backend.tasks.create_idempotent(sub, tenant="t", key="k", request_hash="h1")
    again, created_again = backend.tasks.create_idempotent(sub, tenant="t", key="k", request_hash="h1")
    assert created and not created_again and again.task_id == first.task_id
    with pytest.raises(IdempotencyConflict):
        backend.tasks.create_idempotent(sub, tenant="t", key="k", request_hash="h2")
    other, created_other = backend.tasks.create_idempotent(sub, tenant="t2", key="k", request_hash="h2")
    assert created_other and other.task_id != first.task_id


def test_an_unstarted_task_can_be_undone_but_not_once_claimed(backend: Storage) -> None:
    sub = scripted([{"text": "x"}])
    task, _ = backend.tasks.create_idempotent(sub, tenant="t", key="k", request_hash="h")
    backend.tasks.delete_unstarted(task.task_id, idempotency=("t", "k"))
    with pytest.raises(TaskNotFound):
        backend.tasks.get(task.task_id)
    assert backend.tasks.idempotency("t", "k") is None
    lease = claimed(backend)
    with pytest.raises(TransactionCancelled):
        backend.tasks.delete_unstarted(lease.task_id)
    assert backend.tasks.get(lease.task_id).status is TaskStatus.RUNNING


def test_a_task_a_keyed_retry_sent_again_is_never_undone_under_it(backend: Storage) -> None:
    """A retry marks the task before it resends it (``mark_resent``): the first request's undo
    of a failed enqueue is then refused, so the id the retry answered stays a task; a task
    undone before the mark is not marked (the retry goes on as a new request)."""
    sub = scripted([{"text": "x"}])
    task, _ = backend.tasks.create_idempotent(sub, tenant="t", key="resent", request_hash="h")
    assert backend.tasks.mark_resent(task.task_id)
    with pytest.raises(TransactionCancelled):
        backend.tasks.delete_unstarted(task.task_id, idempotency=("t", "resent"))
    assert backend.tasks.get(task.task_id).status is TaskStatus.QUEUED
    assert backend.tasks.idempotency("t", "resent") is not None
    gone, _ = backend.tasks.create_idempotent(sub, tenant="t", key="undone", request_hash="h")
    backend.tasks.delete_unstarted(gone.task_id, idempotency=("t", "undone"))
    assert not backend.tasks.mark_resent(gone.task_id)
    with pytest.raises(TaskNotFound):
        backend.tasks.get(gone.task_id)


def test_a_tenant_lists_its_own_root_tasks_newest_first_in_pages(backend: Storage) -> None:
    ids = []
    for _ in range(5):
        ids.append(new_task(backend, tenant="a"))
        time.sleep(0.002)
    new_task(backend, tenant="b")
    page, cursor = backend.tasks.list_for_tenant("a", limit=3)
    assert [t.task_id for t in page] == ids[::-1][:3] and cursor is not None
    rest, end = backend.tasks.list_for_tenant("a", limit=3, after=cursor)
    assert [t.task_id for t in rest] == ids[::-1][3:] and end is None
    backend.tasks.transition(ids[0], TaskStatus.CANCELLED)
    cancelled, _ = backend.tasks.list_for_tenant("a", limit=10, status=TaskStatus.CANCELLED)
    assert [t.task_id for t in cancelled] == [ids[0]]


def test_a_tenants_listing_leaves_out_a_task_stored_as_nothing_can_read_and_lists_the_rest(backend: Storage) -> None:
    """One task whose submission no code of this release can read (written by hand, by a
    release that wrote what this one refuses) made GET /tasks a 500 for its whole tenant: the
    listing reads its page of tasks in one batch. It is left out, named in a warning; reading it
    by its id still says what is wrong."""
    ids = []
    for _ in range(3):
        ids.append(new_task(backend, tenant="a"))
        time.sleep(0.002)
    backend.tasks.table.update(keys.submission_key(ids[1]), Update(set={"submission": "{not json"}))
    page, end = backend.tasks.list_for_tenant("a", limit=10)
    assert [t.task_id for t in page] == [ids[2], ids[0]] and end is None
    with pytest.raises(ValueError):
        backend.tasks.get(ids[1])


@pytest.mark.parametrize("stored_before_digests", [False, True])
def test_a_submission_replaced_since_it_was_read_is_read_again_and_the_change_made_of_it(
    backend: Storage, stored_before_digests: bool
) -> None:
    """A replace is a read, then a write conditional on the submission being the one read (its
    digest; an item stored before digests were recorded has none): a write between the two is
    never undone. Here a second replace lands inside the first's change, each adding 5 steps."""
    task_id = new_task(backend)
    if stored_before_digests:
        item = dict(backend.table.get(keys.submission_key(task_id)) or {})
        backend.table.put({k: v for k, v in item.items() if k != "digest"})
    made: list[int] = []

    def more_steps(submission: TaskSubmission) -> TaskSubmission:
        made.append(submission.constraints.max_steps)
        if len(made) == 1:  # another writer, between this read and this write
            backend.tasks.replace_submission(task_id, more_steps, when_status=TaskStatus.QUEUED)
        return submission.model_copy(update={"constraints": submission.constraints.model_copy(
            update={"max_steps": submission.constraints.max_steps + 5})})  # fmt: skip

    backend.tasks.replace_submission(task_id, more_steps, when_status=TaskStatus.QUEUED)
    first = made[0]
    assert made == [first, first, first + 5]  # the first made again of what the second wrote
    assert backend.tasks.get(task_id).submission.constraints.max_steps == first + 10


def test_a_message_raise_is_made_of_the_submission_its_write_replaces(
    backend: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message's raise of the step cap is put only while the submission is the one its accept
    read: one replaced in between (a move, another raise) is read again, never undone."""
    task_id = new_task(backend)
    base = backend.tasks.get(task_id).submission.constraints.max_steps
    transact = backend.table.transact
    calls = 0

    def replaced_first(actions: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # between the accept's read and its write
            backend.tasks.replace_submission(task_id, lambda s: s.model_copy(update={"system": "moved"}),
                                             when_status=TaskStatus.QUEUED)  # fmt: skip
        return transact(actions, **kwargs)

    monkeypatch.setattr(backend.table, "transact", replaced_first)
    backend.messages.accept(task_id, "go on", raised=BudgetRaise(steps=5))
    monkeypatch.undo()
    after = backend.tasks.get(task_id).submission
    assert (after.system, after.constraints.max_steps) == ("moved", base + 5)
    assert backend.tasks.get(task_id).messages_received == 1


def test_a_submission_is_replaced_only_in_the_status_named(backend: Storage) -> None:
    task_id = new_task(backend)
    bigger = scripted([{"text": "x"}], max_steps=99)
    backend.tasks.replace_submission(task_id, lambda _: bigger, when_status=TaskStatus.QUEUED)
    assert backend.tasks.get(task_id).submission.constraints.max_steps == 99
    with pytest.raises(IllegalTransition):
        backend.tasks.replace_submission(task_id, lambda _: scripted([{"text": "x"}]), when_status=TaskStatus.PAUSED)
    assert backend.tasks.get(task_id).submission.constraints.max_steps == 99


def test_meta_stays_within_one_write_unit_however_many_times_a_task_is_claimed(backend: Storage) -> None:
    task_id = new_task(backend)
    for i in range(40):
        got = backend.tasks.claim(task_id, f"worker-{i:03d}.example:{1000 + i}", 0.001)
        assert got is not None
        time.sleep(0.002)
    meta = backend.table.get({"pk": f"TASK#{task_id}", "sk": "META"})
    # 1 KB: every step commit rewrites META, and a write is billed per started KB of the item.
    assert meta is not None and item_size(meta) <= 1024
    assert len(backend.tasks.claims(task_id)) == 40


def _retry(step: int, attempt: int, scope: str = "call") -> RetryState:
    return RetryState.model_validate(
        {"step": step, "scope": scope, "attempt": attempt, "max_attempts": 5, "code": "overloaded",
         "message": "anthropic overloaded (529): Overloaded", "status_code": 529, "at": 100.5, "next_at": 102.0}
    )  # fmt: skip


def test_the_latest_retry_reads_back_with_the_task_and_is_current_until_its_step_commits(backend: Storage) -> None:
    held = claimed(backend)
    task_id = held.task_id
    assert backend.tasks.record_retry(task_id, _retry(1, 1), lease=held)
    assert backend.tasks.record_retry(task_id, _retry(1, 2), lease=held)  # replaces, never accumulates
    task = backend.tasks.get(task_id)
    assert task.retry == _retry(1, 2) and task.retrying == _retry(1, 2)
    assert task.retry.next_at == 102.0 and task.retry.status_code == 529  # floats and ints survive the table
    assert task.model_copy(update={"step": 1}).retrying is None  # its step committed: history


def test_a_retry_is_fenced_by_the_lease_and_not_recorded_on_an_ended_task(backend: Storage) -> None:
    task_id = new_task(backend)
    first = backend.tasks.claim(task_id, "w1", 0.05)
    assert first is not None
    old = first[0]
    time.sleep(0.1)
    assert backend.tasks.claim(task_id, "w2", 30) is not None
    with pytest.raises(LeaseLost):
        backend.tasks.record_retry(task_id, _retry(1, 1), lease=old)
    assert backend.tasks.record_retry(task_id, _retry(1, 1, "delivery"))  # the queue's, unfenced: running
    backend.tasks.transition(task_id, TaskStatus.CANCELLED)
    assert backend.tasks.record_retry(task_id, _retry(1, 2, "delivery")) is False
    task = backend.tasks.get(task_id)
    assert task.retry == _retry(1, 1, "delivery") and task.retrying is None


def test_unfinished_tasks_are_listed_for_the_sweeper_and_leave_the_list_when_they_end(backend: Storage) -> None:
    running, cancelled, requeued = claimed(backend).task_id, new_task(backend), new_task(backend)
    backend.tasks.transition(cancelled, TaskStatus.CANCELLED)
    backend.tasks.transition(requeued, TaskStatus.FAILED, error={"code": "x", "message": "y"})
    listed = set(backend.tasks.live_task_ids(page_size=2))  # pages through every shard
    assert running in listed and cancelled not in listed and requeued not in listed
    backend.tasks.transition(requeued, TaskStatus.QUEUED)  # a redrive: back on the list
    assert requeued in set(backend.tasks.live_task_ids())
    metas = {m["task_id"]: m for m in backend.tasks.metas([running, requeued])}
    assert metas[running]["status"] == "running" and metas[requeued]["status"] == "queued"


def test_only_an_ended_task_can_be_taken_off_the_sweepers_list(backend: Storage) -> None:
    queued = new_task(backend)
    backend.tasks.unlist(queued)  # refused: it has not ended
    assert queued in set(backend.tasks.live_task_ids())


def test_a_tasks_own_failures_are_counted_at_its_step_and_progress_starts_the_count_again(backend: Storage) -> None:
    task_id = new_task(backend)
    assert [backend.tasks.record_failure(task_id, 1) for _ in range(3)] == [1, 2, 3]
    assert backend.tasks.record_failure(task_id, 2) == 1  # a step committed since: a new count
    with pytest.raises(TaskNotFound):
        backend.tasks.record_failure("no-such-task", 1)


def test_a_users_tasks_are_listed_apart_from_the_tenants_others_newest_first(backend: Storage) -> None:
    def made(tenant: str, user: str | None) -> str:
        sub = scripted([{"text": "x"}]).model_copy(update={"user": user})
        time.sleep(0.002)
        return backend.tasks.create(sub, tenant=tenant).task_id

    alice = [made("a", "alice") for _ in range(4)]
    made("a", "bob"), made("a", None), made("b", "alice")  # another user, none, another tenant's alice
    page, cursor = backend.tasks.list_for_tenant("a", limit=3, user="alice")
    assert [t.task_id for t in page] == alice[::-1][:3] and cursor is not None
    rest, end = backend.tasks.list_for_tenant("a", limit=3, user="alice", after=cursor)
    assert [t.task_id for t in rest] == alice[::-1][3:] and end is None
    assert {t.user for t in page + rest} == {"alice"}
    backend.tasks.transition(alice[0], TaskStatus.CANCELLED)
    cancelled, _ = backend.tasks.list_for_tenant("a", limit=10, user="alice", status=TaskStatus.CANCELLED)
    assert [t.task_id for t in cancelled] == [alice[0]]
    assert len(backend.tasks.list_for_tenant("a", limit=10)[0]) == 6  # the tenant's listing holds them all


def test_meta_with_the_longest_tenant_and_user_stays_within_one_write_unit(backend: Storage) -> None:
    sub = scripted([{"text": "x"}]).model_copy(update={"user": "u" * 128})
    task_id = backend.tasks.create(sub, tenant="t" * 64).task_id
    for i in range(40):
        got = backend.tasks.claim(task_id, f"worker-{i:03d}.example:{1000 + i}", 0.001)
        assert got is not None
        time.sleep(0.002)
    meta = backend.table.get({"pk": f"TASK#{task_id}", "sk": "META"})
    assert meta is not None
    assert item_size(meta) <= 1024, item_size(meta)


# Every status a task can be moved into from running (blocked is only ever a new task's).
NOT_WAITING = [s for s in TaskStatus if s not in (TaskStatus.WAITING, TaskStatus.BLOCKED)]


@pytest.mark.parametrize("status", NOT_WAITING)
def test_a_next_looks_due_time_is_written_only_on_a_waiting_task(backend: Storage, status: TaskStatus) -> None:
    waiting = new_task(backend)
    backend.tasks.transition(waiting, TaskStatus.RUNNING)
    backend.tasks.transition(waiting, TaskStatus.WAITING)
    assert backend.tasks.next_look(waiting, 1234.5, after=None) is True
    assert backend.tasks.get(waiting).look_due == pytest.approx(1234.5)
    other = new_task(backend)
    for step in {TaskStatus.QUEUED: [], TaskStatus.RUNNING: [TaskStatus.RUNNING]}.get(
        status, [TaskStatus.RUNNING, status]
    ):
        backend.tasks.transition(other, step)
    before = backend.tasks.get(other)
    assert before.status is status
    assert backend.tasks.next_look(other, 1234.5, after=None) is False
    assert backend.tasks.get(other) == before
    assert backend.tasks.next_look("no-such-task", 1234.5, after=None) is False


def test_a_next_looks_due_time_moves_only_from_the_due_its_caller_read(backend: Storage) -> None:
    """A compare-and-set: of two looks that read one due, only the first moves it."""
    task_id = new_task(backend)
    backend.tasks.transition(task_id, TaskStatus.RUNNING)
    backend.tasks.transition(task_id, TaskStatus.WAITING)
    first = time.time() + 0.123456789  # a due as a park writes it: a float with every digit
    assert backend.tasks.next_look(task_id, first, after=None) is True
    assert backend.tasks.next_look(task_id, 999.0, after=None) is False  # it has a due now
    read = backend.tasks.get(task_id).look_due
    assert read is not None
    assert backend.tasks.next_look(task_id, read + 30, after=read) is True  # the look that read it
    assert backend.tasks.next_look(task_id, read + 60, after=read) is False  # another that read the same
    assert backend.tasks.get(task_id).look_due == pytest.approx(read + 30, abs=0.01)


ECHOED = "sk-live-ECHOED-7f3a9c1e55d0b2"


@pytest.mark.parametrize("write", ["a transition", "a finishing commit", "a retry's record"])
def test_a_credential_a_failures_message_quotes_is_recorded_redacted(backend: Storage, write: str) -> None:
    """A failure's message may quote an outside party that was sent a credential (git's stderr
    from a clone, a server's answer): META's ``error`` and ``META#RETRY`` are served by the API,
    the console and callbacks, so every way a worker or the queue records one is redacted."""
    lease = claimed(backend)
    task_id = lease.task_id
    said = f"fatal: remote error: invalid credentials: Bearer {ECHOED}"
    hold = REDACTOR.hold()
    hold.add(ECHOED)
    try:
        if write == "a transition":
            backend.tasks.transition(task_id, TaskStatus.FAILED, lease=lease, error={"code": "x", "message": said})
        elif write == "a finishing commit":
            error = {"code": "x", "message": said, "field": said}
            backend.steps.commit(lease, 1, llm_step(), root_id=task_id, finish=TaskStatus.FAILED, error=error)
        else:
            retry = _retry(1, 1).model_copy(update={"message": said})
            assert backend.tasks.record_retry(task_id, retry, lease=lease)
    finally:
        hold.release()
    task = backend.tasks.get(task_id)
    stored = json.dumps([task.error, task.retry.model_dump() if task.retry else None])
    assert ECHOED not in stored and "invalid credentials: Bearer" in stored


def test_the_settling_of_a_batchs_windows_hold_is_taken_once_and_never_by_a_worker_whose_lease_moved_on(
    backend: Storage,
) -> None:
    """``take_batch_hold`` (``core.engine._llm_batch``): of everyone who meets a batch's outcome
    (a run that holds the lease, a cancel once the task ended), one settles the hold its park
    recorded on the windows; a run whose lease moved on learns it instead, and takes nothing.
    Only the task's own batch; a batch forgotten (sent anew) forgets that it was settled."""
    first = claimed(backend)
    task_id = first.task_id
    backend.tasks.transition(task_id, TaskStatus.WAITING, lease=first, extra={"batch": {"id": "b1", "step": 1}})
    backend.tasks.transition(task_id, TaskStatus.QUEUED)  # what the batch's poll message does
    got = backend.tasks.claim(task_id, "w2", 30)
    assert got is not None
    lease = got[0]
    with pytest.raises(LeaseLost):
        backend.tasks.take_batch_hold(first, "b1")
    assert backend.tasks.take_batch_hold(lease, "b0") is False  # not the task's batch
    assert backend.tasks.take_batch_hold(lease, "b1") is True
    assert backend.tasks.take_batch_hold(lease, "b1") is False
    assert backend.tasks.take_batch_hold_at_end(task_id, "b1") is False
    assert backend.tasks.get(task_id).batch_settled == "b1"
    backend.tasks.release(lease, forget_batch=True)
    after = backend.tasks.get(task_id)
    assert after.batch is None and after.batch_settled is None

    ended = claimed(backend)
    backend.tasks.transition(ended.task_id, TaskStatus.WAITING, lease=ended, extra={"batch": {"id": "b2", "step": 1}})
    backend.tasks.transition(ended.task_id, TaskStatus.CANCELLED)
    assert backend.tasks.take_batch_hold_at_end(ended.task_id, "b2") is True
    assert backend.tasks.take_batch_hold_at_end(ended.task_id, "b2") is False


def test_a_workspace_start_refused_by_the_tasks_own_state_is_a_fault_and_by_the_fence_a_lost_lease(
    backend: Storage,
) -> None:
    """The start's record is step 0's files, written once: refused because a step committed or a
    start is already there, it is ``WorkspaceStartRefused`` (the same at every claim, so the
    engine fails the task); refused by the fence (a takeover), ``LeaseLost`` as every write is.
    Both used to be ``LeaseLost``: a task with a step and no start was cloned and held again by
    every claim, for ever."""
    ref = WorkspaceRef(manifest="a" * 64)
    stepped = claimed(backend)
    backend.steps.commit(stepped, 1, llm_step(), root_id=stepped.task_id)
    with pytest.raises(WorkspaceStartRefused, match="at step 1") as refused:
        backend.tasks.start_workspace(stepped, ref)
    assert refused.value.code == "workspace_start_refused"
    started = claimed(backend)
    backend.tasks.start_workspace(started, ref)
    with pytest.raises(WorkspaceStartRefused, match="already recorded"):
        backend.tasks.start_workspace(started, WorkspaceRef(manifest="b" * 64))
    assert backend.tasks.get(started.task_id).workspace_start == ref
    task_id = new_task(backend)
    old = backend.tasks.claim(task_id, "w1", 0.05)
    assert old is not None
    time.sleep(0.1)
    assert backend.tasks.claim(task_id, "w2", 30) is not None
    with pytest.raises(LeaseLost, match="superseded"):
        backend.tasks.start_workspace(old[0], ref)
    assert backend.tasks.get(task_id).workspace_start is None


def _stepped(backend: Storage, steps: int) -> str:
    """A task with ``steps`` committed LLM steps, the last its answer."""
    lease = claimed(backend)
    for n in range(1, steps + 1):
        ending = {"finish": TaskStatus.SUCCEEDED, "result": "hi"} if n == steps else {}
        backend.steps.commit(lease, n, llm_step(), root_id=lease.task_id, **ending)  # type: ignore[arg-type]
    return lease.task_id


def test_a_fork_is_invisible_until_whole_expires_if_cut_short_and_a_retry_under_its_id_takes_it_over(
    backend: Storage,
) -> None:
    """A fork writes META first as a placeholder with a near expiry, then its steps and objects,
    then the task over the placeholder. Cut short (here a copy that fails at its third step), it
    is no task to any read or listing, and its META carries the TTL that collects what it copied
    (it used to leave steps under no META at all). Retried under the same id it completes; an id
    that is a whole task is never written over."""
    source_id = _stepped(backend, 2)
    source = backend.tasks.get(source_id)
    longer = backend.steps.load(_stepped(backend, 3))
    with pytest.raises(KeyError):  # the source has no step 3 to copy: the fork stops after its placeholder
        backend.tasks.fork(source, source.submission, longer, tenant="t", task_id="fork-1")
    with pytest.raises(TaskNotFound):
        backend.tasks.get("fork-1")
    assert backend.tasks.get_many(["fork-1"]) == []
    assert "fork-1" not in [t.task_id for t in backend.tasks.list_for_tenant("t", limit=100)[0]]
    assert backend.tasks.claim("fork-1", "w1", 30) is None
    placeholder = backend.table.get(keys.meta_key("fork-1"))
    assert placeholder is not None and time.time() < placeholder["expires_at"] <= time.time() + FORK_PENDING_SECONDS
    assert "status" not in placeholder and "gsi1pk" not in placeholder

    fork = backend.tasks.fork(source, source.submission, backend.steps.load(source_id), tenant="t", task_id="fork-1")
    whole = backend.table.get(keys.meta_key("fork-1"))
    assert whole is not None and "expires_at" not in whole and FORK_PENDING not in whole
    assert backend.tasks.get("fork-1").status is TaskStatus.QUEUED and fork.step == 2
    assert [s.number for s in backend.steps.load("fork-1")] == [1, 2]
    with pytest.raises(ConditionFailed):
        backend.tasks.fork(source, source.submission, backend.steps.load(source_id), tenant="t", task_id=source_id)
    assert backend.tasks.get(source_id).status is TaskStatus.SUCCEEDED


def test_a_fork_cut_short_is_purged_once_its_placeholder_expired_and_not_before(backend: Storage) -> None:
    """The purge need not wait for TTL (which deletes within days of the expiry) once the
    placeholder expired; before, the fork may still be copying and the purge refuses it."""
    source = backend.tasks.get(_stepped(backend, 2))
    with pytest.raises(KeyError):
        backend.tasks.fork(source, source.submission, backend.steps.load(_stepped(backend, 3)), tenant="t",
                           task_id="fork-2")  # fmt: skip
    with pytest.raises(IllegalTransition, match="still being copied"):
        backend.purge.task("fork-2")
    assert backend.steps.raw_items("fork-2")
    backend.table.update(keys.meta_key("fork-2"), Update(set={"expires_at": int(time.time()) - 1}))
    assert backend.purge.task("fork-2").items > 0
    assert backend.steps.raw_items("fork-2") == []


def test_the_trace_of_an_ended_invocation_is_noted_on_the_task_and_nothing_on_a_deleted_one(backend: Storage) -> None:
    task_id = new_task(backend)
    assert backend.tasks.get(task_id).traced_invocation is None
    backend.tasks.transition(task_id, TaskStatus.CANCELLED)
    backend.tasks.note_traced(task_id, 0)
    assert backend.tasks.get(task_id).traced_invocation == 0
    backend.tasks.note_traced("nope", 0)  # a task deleted meanwhile: nothing written
    with pytest.raises(TaskNotFound):
        backend.tasks.get("nope")
