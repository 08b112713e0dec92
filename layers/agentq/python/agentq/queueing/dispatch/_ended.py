"""A message for a task that already ended: a redelivery, or a redrive from the DLQ.

A redelivery (a crash between the end and its report, a duplicate) reports the end again
(``queueing.endings.task_ended``: slots, parent, callback, dependents), and a task still holding
an older epoch's budget hold counts it as spent once its call can no longer complete. A message
back from the DLQ for a task we failed (its ``agentq-reason`` attribute) is a redrive: the
operator wants the task resumed from its checkpoint, out of the failure it was dead-lettered for
(its ``agentq-dead-letter``) and out of no later one.
"""

from __future__ import annotations

import logging
from typing import Any

from agentq import observe
from agentq.core.errors import IllegalTransition
from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch._context import Action, Context
from agentq.queueing.queues import DEAD_LETTER_ID, DEAD_LETTER_REASON

log = logging.getLogger("agentq.dispatch")


def answer_ended(ctx: Context, task: Task, tier: str, attributes: dict[str, Any] | None) -> Action | Task:
    """The Action for a message of an ended ``task``, or the task as it is after a redrive
    requeued it (to run now)."""
    _trace_end(ctx, task)
    if task.status is TaskStatus.FAILED and _was_dead_lettered(attributes):
        if _requeue_redriven(ctx, task, attributes):
            return task
        task = ctx.store.tasks.get(task.task_id)
        if task.status.terminal:  # a copy of an older redrive: the task failed again since
            return Action("delete", f"task {task.status.value} again since this dead letter was redriven; "
                          "its later dead letter is the one to redrive", task_id=task.task_id)  # fmt: skip
        return task  # another copy of the redrive requeued it: the claim decides
    # A crash between its end and the release; or, holding none, it may have been woken for a
    # slot and ended (cancelled) before this message: pass the wake on.
    ctx.end(task, task.status, give_back=lambda: _release_or_pass_on(ctx, task))
    if task.lapsed_holds:
        release_lapsed(ctx, task, tier)
    return Action("delete", f"task already {task.status.value}", task_id=task.task_id)


def _trace_end(ctx: Context, task: Task) -> None:
    """The ``invoke_agent`` span of the invocation that ended, when the run that ended it did not
    note it sent (``Task.traced_invocation``: killed between the end's commit and the span's
    flush, or ended by no run, as a cancel): without it the invocation's runs hang from a parent
    that never arrives. Its id is derived, so it is the span the run would have sent."""
    if not observe.otel.enabled() or task.traced_invocation == task.invocation:
        return
    observe.otel.task_ended(task, task.status.value, task.error, tokens=(task.tokens_in, task.tokens_out))
    try:
        ctx.store.tasks.note_traced(task.task_id, task.invocation)
    except Exception:  # the span went out; another redelivery may send it again
        log.warning("could not note the trace of task %s's end", task.task_id, exc_info=True)


def _release_or_pass_on(ctx: Context, task: Task) -> None:
    if not ctx.fair.release(task.task_id):
        ctx.fair.pass_on(task)


def _requeue_redriven(ctx: Context, task: Task, attributes: dict[str, Any] | None) -> bool:
    """SQS may deliver the redriven message again after the resumed task failed once more and
    was dead-lettered again, and that copy must not resume it (the task would run while the DLQ
    lists it failed). A message without the attribute (dead-lettered before it existed, or by
    hand) resumes whatever failure the task is in. False when not requeued."""
    failure = _dead_letter_id(attributes)
    try:
        ctx.store.tasks.transition(task.task_id, TaskStatus.QUEUED, error=None, reopen=True,
                                   expect={"dead_letter": failure} if failure else None)  # fmt: skip
    except IllegalTransition:
        return False  # another copy of the redrive requeued it (the claim below decides), or a later failure
    log.info("redrive: task %s requeued from its checkpoint (step %s)", task.task_id, task.step)
    return True


def release_lapsed(ctx: Context, task: Task, tier: str) -> None:
    """A task no run will claim for them (ended, or parked: ``_run``) still holding an older
    epoch's hold: count it as spent once its call can no longer complete, coming back for it
    with a delayed message until then."""
    wait = ctx.engine.spend_lapsed_holds(task)
    if wait > 0:
        ctx.send_later(task.task_id, tier, "release_holds", wait, tenant=task.tenant)


def _was_dead_lettered(attributes: dict[str, Any] | None) -> bool:
    return bool(attributes and DEAD_LETTER_REASON in attributes)


def _dead_letter_id(attributes: dict[str, Any] | None) -> str | None:
    """The failure a redriven message was dead-lettered for, as SQS (``StringValue``) or Lambda
    (``stringValue``) hands its attributes over."""
    attr = (attributes or {}).get(DEAD_LETTER_ID) or {}
    value = attr.get("StringValue", attr.get("stringValue"))
    return str(value) if value else None
