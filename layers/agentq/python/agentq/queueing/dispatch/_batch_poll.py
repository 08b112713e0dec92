"""``batch_poll``: the poller of economy mode. A task waiting on a batch looks at it on a delayed
message of its own (no table scan, nothing to schedule). Ended (or failed: the run reads why):
the task is queued and runs now. Not yet: the next look is set, later as the batch ages."""

from __future__ import annotations

import contextlib

from agentq.core.engine import batch_poll_seconds
from agentq.core.errors import IllegalTransition, ProviderError
from agentq.core.models import Task, TaskStatus
from agentq.core.providers.base import BatchProvider
from agentq.queueing.dispatch import _arrival, _attempt
from agentq.queueing.dispatch._context import Action, Context, Delivery
from agentq.queueing.queues import TaskMessage


def handle(ctx: Context, message: TaskMessage, delivery: Delivery) -> Action:
    task = _arrival.receive(ctx, message, delivery)
    if isinstance(task, Action):
        return task
    if not _batch_ended(ctx, task, delivery.tier):
        return Action("delete", "no batch to look at, or it has not ended yet", task_id=task.task_id)
    return _attempt.run(ctx, ctx.store.tasks.get(task.task_id), delivery)


def _batch_ended(ctx: Context, task: Task, tier: str) -> bool:
    batch = task.batch
    if task.status is not TaskStatus.WAITING or not batch:
        return False
    provider = ctx.engine.providers(task.submission)
    try:
        ended = not isinstance(provider, BatchProvider) or (
            provider.batch_result(str(batch["id"]), str(batch["custom_id"])) is not None
        )
    except ProviderError:
        ended = True  # the run meets the same error and handles it
    if not ended:
        ctx.send_later(task.task_id, tier, "batch_poll", batch_poll_seconds(batch), tenant=task.tenant)
        return False
    with contextlib.suppress(IllegalTransition):
        ctx.store.tasks.transition(task.task_id, TaskStatus.QUEUED)
    return True
