"""The kinds that simply run the task: ``run`` (a submission's), ``continue`` (a time slice's or
a deferral's), ``safety_net``, ``renewed``, ``swept``, ``recovered``, ``release_holds``,
``redrive`` (whatever the kind, a message back from the DLQ is a redrive: ``_ended``). A task
that waits for a message of its own (children, an approval, a batch, a conversation's next
message) is left to it, but for the holds a ``release_holds`` message came for: a parked task
holds them until that message, as an ended one does (``_ended.release_lapsed``), since no claim
may come at their deadline (an idle conversation may never be claimed again)."""

from __future__ import annotations

from agentq.queueing.dispatch import _arrival, _attempt, _ended
from agentq.queueing.dispatch._context import PARKED, Action, Context, Delivery, parked
from agentq.queueing.queues import TaskMessage


def handle(ctx: Context, message: TaskMessage, delivery: Delivery) -> Action:
    task = _arrival.receive(ctx, message, delivery)
    if isinstance(task, Action):
        return task
    if message.kind == "release_holds" and task.status in PARKED and task.lapsed_holds:
        _ended.release_lapsed(ctx, task, delivery.tier)
    return parked(task) or _attempt.run(ctx, task, delivery)
