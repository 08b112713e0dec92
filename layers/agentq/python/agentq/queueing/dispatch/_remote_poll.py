"""``remote_poll``: a task waiting on a remote A2A agent's task (``core.engine._remote``) looks at
it again. The message only wakes the task: the run re-attaches to the remote task recorded on
the call's effect, and parks again (with the next look set) if it has not ended, so a look holds a
worker only for that one request. A task found running is treated as a plain run treats it (its
worker died mid-look: taken over once its lease lapses), an ended or paused one is left alone;
one waiting on something else parks again by itself when it finds that still pending (a spawn, a
batch), so a stray look costs one claim, nothing more. A look that arrives while the task's next
look is due well after now is a stray, deleted without a claim (``_looks``)."""

from __future__ import annotations

import contextlib

from agentq.core.errors import IllegalTransition
from agentq.core.models import TaskStatus
from agentq.queueing.dispatch import _arrival, _attempt, _looks
from agentq.queueing.dispatch._context import Action, Context, Delivery, parked
from agentq.queueing.queues import TaskMessage


def handle(ctx: Context, message: TaskMessage, delivery: Delivery) -> Action:
    task = _arrival.receive(ctx, message, delivery)
    if isinstance(task, Action):
        return task
    early = _looks.stray(task)
    if early is not None:
        return early
    if task.status is TaskStatus.WAITING:
        with contextlib.suppress(IllegalTransition):  # a wake of another kind got there first
            ctx.store.tasks.transition(task.task_id, TaskStatus.QUEUED)
        task = ctx.store.tasks.get(task.task_id)
    # Anything else is as a plain run finds it: a run whose worker died mid-look is taken over
    # (this message is then the task's only one), a paused task is left to its decision.
    return parked(task) or _attempt.run(ctx, task, delivery)
