"""``wake``: a fan-out ended (its Step Functions execution sends it, naming the spawn): the spawn
is marked woken and the parent made runnable again, then it runs. A wake naming no spawn is
treated as a plain run."""

from __future__ import annotations

import contextlib

from agentq.core.errors import IllegalTransition
from agentq.core.models import TaskStatus
from agentq.queueing.dispatch import _arrival, _attempt
from agentq.queueing.dispatch._context import Action, Context, Delivery, parked
from agentq.queueing.queues import TaskMessage


def handle(ctx: Context, message: TaskMessage, delivery: Delivery) -> Action:
    task = _arrival.receive(ctx, message, delivery)
    if isinstance(task, Action):
        return task
    if not message.spawn_id:
        return parked(task) or _attempt.run(ctx, task, delivery)
    ctx.store.spawns.mark(task.task_id, message.spawn_id, woken=True)
    # Refused when still running (it parks itself and this message comes back) or already queued.
    with contextlib.suppress(IllegalTransition):
        ctx.store.tasks.transition(task.task_id, TaskStatus.QUEUED)
    return _attempt.run(ctx, task, delivery)
