"""A run's failures: counted on the task, retried with backoff, and on the last allowed attempt
the task failed and its message dead-lettered (from where a redrive resumes it, ``_ended``).

Retryable failures (provider overload, throttling, an outage) are counted on the task's META at
the step they failed on, never by the message's receives: receives spent by worker faults (a
killed or stopped holder, a duplicate waiting out a live lease) renew the message instead
(``_arrival``), so SQS's redrive backstop never dead-letters a healthy task. A deterministic
fault (``DETERMINISTIC_FAULTS``) fails the task at once (``fail``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from agentq.core.engine import RunResult
from agentq.core.errors import IllegalTransition, TaskNotFound
from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch._context import Action, Context


def count_failure(ctx: Context, run: RunResult) -> int:
    """This retryable failure, counted on the task (at the step it failed on): the attempts
    so far. A worker fault never gets here, so it never counts."""
    claimed = run.claimed
    step = (claimed.step if claimed else 0) + run.steps_committed + 1
    try:
        return ctx.store.tasks.record_failure(run.task_id, step)
    except TaskNotFound:
        return ctx.max_receive_count  # gone: nothing left to retry


def retry_or_dead_letter(ctx: Context, run: RunResult, *, give_back: Callable[[], object] | None) -> Action:
    """A retryable failure: the message comes back after a backoff, or, on the last allowed
    attempt, the task ends ``failed`` and the message goes to the DLQ with this failure's id
    (META's ``dead_letter``). ``give_back``: the slots the run's gate took, if any."""
    task_id = run.task_id
    error = run.error or {}
    attempts = count_failure(ctx, run)
    if attempts < ctx.max_receive_count:
        delay = int(error.get("retry_after") or ctx.backoff.delay(attempts))
        return Action("retry", f"retryable: {error.get('message', '')}", delay_seconds=delay, task_id=task_id,
                      run=run, attempts=attempts)  # fmt: skip
    reason = f"failed after {attempts} attempts: {error.get('message', 'retryable error')}"
    failure = uuid.uuid4().hex  # this failure, on META and on its dead letter
    # dead_lettered: what a person is told to do with it (redrive, not only fork)
    failed = {**error, "attempts": attempts, "dead_lettered": True}
    try:
        ctx.store.tasks.transition(task_id, TaskStatus.FAILED, error=failed, extra={"dead_letter": failure})
    except IllegalTransition:
        # Not ours to fail: another delivery of the task (a duplicate that claimed it once this
        # run gave its lease back) failed it and dead-lettered its own message, or it ended,
        # paused or went idle meanwhile. A second dead letter would be listed and redriven as
        # another failure: this copy is deleted.
        now = ctx.store.tasks.get(task_id).status
        if give_back is not None:
            give_back()
        return Action("delete", f"task {now.value} meanwhile: {reason}", task_id=task_id, run=run)
    run.status = TaskStatus.FAILED
    ctx.end(ctx.store.tasks.get(task_id), TaskStatus.FAILED, give_back=give_back)  # its parent wakes
    return Action("dead_letter", reason, task_id=task_id, run=run, dead_letter_id=failure)


def fail(ctx: Context, task: Task, error: dict[str, Any]) -> RunResult:
    """End ``task`` ``failed`` with ``error`` outside any lease (no run holds one): a
    deterministic fault before the engine held a session. The run path reports the end."""
    try:
        ctx.store.tasks.transition(task.task_id, TaskStatus.FAILED, error=error)
    except IllegalTransition:  # it ended meanwhile (a cancel): that end stands
        current = ctx.store.tasks.get(task.task_id)
        return RunResult(task.task_id, "finished", status=current.status, error=current.error)
    return RunResult(task.task_id, "finished", status=TaskStatus.FAILED, error=error)
