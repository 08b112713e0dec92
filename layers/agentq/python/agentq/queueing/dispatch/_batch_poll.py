"""``batch_poll``: the poller of economy mode. A task waiting on a batch looks at it on a delayed
message of its own (no table scan, nothing to schedule). Ended (or failed: the run reads why):
the task is queued and runs now. Not yet: the next look is set, later as the batch ages; when it
is due is written on META first (``TaskTransitions.next_look``, a compare-and-set on the due this
look read, so two looks of one due queue one next look), then the look is queued, so a look lost
with a dispatcher that died between the two is sent by the sweeper once overdue, and a look that
arrives before the due one (a stray: the sweeper's, or a late one) is deleted without asking the
provider (``_looks``)."""

from __future__ import annotations

import contextlib
import time

from agentq.core.engine import batch_poll_seconds
from agentq.core.errors import IllegalTransition, ProviderError
from agentq.core.models import Task, TaskStatus
from agentq.core.providers.base import BatchProvider
from agentq.queueing.dispatch import _arrival, _attempt, _looks
from agentq.queueing.dispatch._context import Action, Context, Delivery
from agentq.queueing.queues import TaskMessage


def handle(ctx: Context, message: TaskMessage, delivery: Delivery) -> Action:
    task = _arrival.receive(ctx, message, delivery)
    if isinstance(task, Action):
        return task
    early = _looks.stray(task)
    if early is not None:
        return early
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
        _next_look(ctx, task, tier, batch_poll_seconds(batch))
        return False
    with contextlib.suppress(IllegalTransition):
        ctx.store.tasks.transition(task.task_id, TaskStatus.QUEUED)
    return True


def _next_look(ctx: Context, task: Task, tier: str, seconds: float) -> None:
    """Queue the next look, its due written first and only by one look (``next_look``: another
    look of the same due, or a new park, got there first: this one queues nothing). A send that
    fails puts the due back, so this message, delivered again, is the due look, not a stray."""
    due = time.time() + seconds
    if not ctx.store.tasks.next_look(task.task_id, due, after=task.look_due):
        return
    try:
        ctx.send_later(task.task_id, tier, "batch_poll", seconds, tenant=task.tenant)
    except BaseException:
        with contextlib.suppress(Exception):
            ctx.store.tasks.next_look(task.task_id, task.look_due or time.time(), after=due)
        raise
