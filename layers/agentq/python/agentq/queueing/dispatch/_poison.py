"""Poison: what no delivery can ever run, straight to the DLQ with the reason: a body that is
not a task message, a task that does not exist, a task whose stored items no longer validate
(``DETERMINISTIC_FAULTS`` on its read)."""

from __future__ import annotations

import logging

import pydantic

from agentq.core.errors import fault_error
from agentq.core.models import TaskStatus
from agentq.queueing.dispatch._context import Action, Context
from agentq.queueing.queues import TaskMessage

log = logging.getLogger("agentq.dispatch")


def not_a_message(exc: pydantic.ValidationError) -> Action:
    return Action("dead_letter", f"poison: not a task message ({exc.errors()[0]['msg']})")


def unknown_task(message: TaskMessage) -> Action:
    return Action("dead_letter", f"poison: unknown task {message.task_id!r}", task_id=message.task_id)


def unreadable_task(ctx: Context, message: TaskMessage, exc: Exception) -> Action:
    """Failed (its META can still be written), its slots given back, its parent told through the
    message's token, and the message dead-lettered with why. Not ``queueing.endings.task_ended``:
    there is no task to read for a callback or its dependents."""
    log.exception("task %s cannot be read", message.task_id)
    error = {**fault_error(exc, code="unreadable_task"), "dead_lettered": True}
    try:
        ctx.store.tasks.transition(message.task_id, TaskStatus.FAILED, error=error)
    except Exception:  # the condition failed and reading the task to say why failed again
        log.warning("task %s could not be marked failed", message.task_id)
    # Its slots are read from the raw META (no model): a failed task gives them back.
    ctx.fair.release(message.task_id)
    if message.task_token and ctx.engine.fanout is not None:
        ctx.engine.fanout.child_finished(message.task_token, message.task_id, TaskStatus.FAILED)
    return Action("dead_letter", f"poison: {error['message']}", task_id=message.task_id)
