"""``approval_due``: a paused task's approval timer fired. Past its timeout the approval takes
the task's ``approval_default`` (recorded as decided by ``timeout``, on the same condition a
person's decision has, so exactly one of them wins) and the task runs on with it. Not yet due
(SQS delays at most 15 minutes): the timer is set again."""

from __future__ import annotations

import logging
import time

from agentq.core.errors import IllegalTransition
from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch import _arrival, _attempt
from agentq.queueing.dispatch._context import Action, Context, Delivery, parked
from agentq.queueing.queues import TaskMessage

log = logging.getLogger("agentq.dispatch")


def handle(ctx: Context, message: TaskMessage, delivery: Delivery) -> Action:
    task = _arrival.receive(ctx, message, delivery)
    if isinstance(task, Action):
        return task
    if not _timed_out(ctx, task, delivery.tier):
        return Action("delete", "no approval to time out, or not yet", task_id=task.task_id)
    task = ctx.store.tasks.get(task.task_id)
    return parked(task) or _attempt.run(ctx, task, delivery)


def _timed_out(ctx: Context, task: Task, tier: str) -> bool:
    """Whether this timer decided the task's pending approval (False: none, not yet, or a person first)."""
    constraints = task.submission.constraints
    timeout = constraints.approval_timeout_seconds
    pending = ctx.store.approvals.pending(task.task_id) if task.status is TaskStatus.PAUSED else None
    if pending is None or timeout is None:
        return False
    wait = pending.asked_at + timeout - time.time()
    if wait > 0:
        ctx.send_later(task.task_id, tier, "approval_due", wait, tenant=task.tenant)
        return False
    note = f"no decision within {timeout}s; the default ({constraints.approval_default}) applies"
    try:
        ctx.store.approvals.decide(task.task_id, pending.use_id, approved=constraints.approval_default == "approve",
                                   note=note, by="timeout")  # fmt: skip
    except IllegalTransition:  # a person decided first: their decision stands, their message runs it
        return False
    log.info("task %s: approval %s timed out: %s", task.task_id, pending.use_id, note)
    return True
