"""Retry notes: what will bring a task back, and when, recorded on it (META#RETRY) so its
status names the retry or the deferral instead of "running" with no error, or an older retry
whose time has passed. Best effort: the retry happens anyway."""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

from agentq.core.engine import RunResult
from agentq.core.models import RetryState, Task
from agentq.queueing.dispatch._context import MAX_VISIBILITY, Action, Context, delay_seconds

log = logging.getLogger("agentq.dispatch")


def note_deferral(ctx: Context, task: Task, run: RunResult) -> None:
    """The run put the task off before its call (an open circuit, a 429's slow-down, a spent
    rate bucket, a cap met, a lost lease's call in flight): why, and until when. The task is
    silent until its delayed message is due (at most SQS's 15 minutes on: a longer deferral
    comes back in hops, ``_outcome``), which the sweeper honours; a hop that defers again for
    the same reason keeps the deferral's first ``at``, so the trace shows when it began."""
    error = run.error or {}
    wait = float(error.get("retry_after") or 1)
    code = error.get("code") or "deferred"
    base = run.claimed or task
    since = _same_deferral(ctx, task.task_id, base.step + run.steps_committed + 1, str(code))
    _note(ctx, task, run, "deferral", attempt=1, max_attempts=1, code=code,
          message=error.get("message") or "deferred", delay=wait, silent_for=delay_seconds(wait),
          deferred_epoch=base.lease_epoch if run.claimed is not None else None, since=since)  # fmt: skip


def note_retry(ctx: Context, task: Task, run: RunResult, action: Action) -> None:
    """The task comes back in ``action.delay_seconds``: why, and when. It is silent (to the
    sweeper) that long, but never past SQS's longest visibility: a provider's Retry-After has no
    bound, and a delay SQS refused leaves the message its old visibility."""
    error = run.error or {}
    _note(ctx, task, run, "delivery", attempt=action.attempts, max_attempts=ctx.max_receive_count,
          code=error.get("code") or "retryable_error", message=error.get("message") or action.reason,
          delay=action.delay_seconds, status_code=error.get("status_code"),
          silent_for=min(action.delay_seconds, MAX_VISIBILITY))  # fmt: skip


def _same_deferral(ctx: Context, task_id: str, step: int, code: str) -> float | None:
    """When the task's current note began, if it is a deferral of this step for this reason
    (a hop of a long deferral, deferred again): None for a new one."""
    try:
        retry = ctx.store.tasks.get(task_id).retry
    except Exception:  # best effort, as the note is
        return None
    if retry is not None and retry.scope == "deferral" and retry.step == step and retry.code == code[:64]:
        return retry.at
    return None


def _note(
    ctx: Context,
    task: Task,
    run: RunResult,
    scope: Literal["delivery", "deferral"],
    *,
    attempt: int,
    max_attempts: int,
    code: Any,
    message: Any,
    delay: float,
    status_code: int | None = None,
    silent_for: float | None = None,
    deferred_epoch: int | None = None,
    since: float | None = None,
) -> None:
    """For the step after the ones this run committed. ``silent_for``: seconds until the
    message that brings the task back is due; ``since``: when a deferral it goes on began."""
    now = time.time()
    base = run.claimed or task
    state = RetryState(
        step=base.step + run.steps_committed + 1,
        scope=scope,
        attempt=attempt,
        max_attempts=max_attempts,
        code=str(code)[:64],
        message=str(message)[:500],
        status_code=status_code,
        at=now if since is None else since,
        next_at=now + delay,
    )
    silent_until = None if silent_for is None else now + silent_for
    try:
        ctx.store.tasks.record_retry(task.task_id, state, silent_until=silent_until, deferred_epoch=deferred_epoch)
    except Exception:
        log.warning("could not record the %s of task %s", scope, task.task_id, exc_info=True)
