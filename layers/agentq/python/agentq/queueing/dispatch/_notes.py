"""Retry notes: what will bring a task back, and when, recorded on it (META#RETRY) so its
status names the retry or the deferral instead of "running" with no error, or an older retry
whose time has passed. Best effort: the retry happens anyway."""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

from agentq.core.engine import RunResult
from agentq.core.models import RetryState, Task
from agentq.queueing.dispatch._context import Action, Context

log = logging.getLogger("agentq.dispatch")


def note_deferral(ctx: Context, task: Task, run: RunResult) -> None:
    """The run put the task off before its call (an open circuit, a 429's slow-down, a spent
    rate bucket, a lost lease's call in flight): why, and until when."""
    error = run.error or {}
    _note(ctx, task, run, "deferral", attempt=1, max_attempts=1, code=error.get("code") or "deferred",
          message=error.get("message") or "deferred", delay=float(error.get("retry_after") or 1))  # fmt: skip


def note_retry(ctx: Context, task: Task, run: RunResult, action: Action) -> None:
    """The task comes back in ``action.delay_seconds``: why, and when."""
    error = run.error or {}
    _note(ctx, task, run, "delivery", attempt=action.attempts, max_attempts=ctx.max_receive_count,
          code=error.get("code") or "retryable_error", message=error.get("message") or action.reason,
          delay=action.delay_seconds, status_code=error.get("status_code"))  # fmt: skip


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
) -> None:
    """For the step after the ones this run committed."""
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
        at=now,
        next_at=now + delay,
    )
    try:
        ctx.store.tasks.record_retry(task.task_id, state)
    except Exception:
        log.warning("could not record the %s of task %s", scope, task.task_id, exc_info=True)
