"""The kinds that simply run the task: ``run`` (a submission's), ``continue`` (a time slice's or
a deferral's), ``safety_net``, ``renewed``, ``swept``, ``recovered``, ``release_holds``,
``redrive`` (whatever the kind, a message back from the DLQ is a redrive: ``_ended``). A task
that waits for a message of its own (children, an approval, a batch, a conversation's next
message) is left to it."""

from __future__ import annotations

from agentq.queueing.dispatch import _arrival, _attempt
from agentq.queueing.dispatch._context import Action, Context, Delivery, parked
from agentq.queueing.queues import TaskMessage


def handle(ctx: Context, message: TaskMessage, delivery: Delivery) -> Action:
    task = _arrival.receive(ctx, message, delivery)
    if isinstance(task, Action):
        return task
    return parked(task) or _attempt.run(ctx, task, delivery)
