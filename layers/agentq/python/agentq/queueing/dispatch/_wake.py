"""``wake``: a fan-out ended (its Step Functions execution sends it, naming the spawn): the spawn
is marked woken and the parent made runnable again, then it runs. A wake naming no spawn is
treated as a plain run.

The gate trusts the slots the task it is handed names (``FairShare.admit``), so the parent is
read again after its move to ``queued`` when the read before it named some: the parent read
still running, its run parks it and gives its slot back (after the run returns, at any moment)
between that read and the move, and another task of the tenant takes the slot; run on the stale
read, the parent ran holding none, one over its tenant's limit. Once ``queued`` no release takes
them (a release is conditional on the task having left ``queued``/``running``), so that read is
the one to trust. A read naming none needs no second one: slots come only with an admission,
which the gate's own transaction sees. Cost: nothing on the usual wake (the parked parent gave
its slot back long before its children ended, and a parked task's read naming slots has them
given back by ``_arrival``), one GetItem when the read named slots."""

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
    if task.slots:  # the read may be stale: see the module
        task = ctx.store.tasks.get(task.task_id)
    return _attempt.run(ctx, task, delivery)
