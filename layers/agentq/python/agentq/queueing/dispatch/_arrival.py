"""What every message for a task does first, whatever its kind: read the task (poison when it
is unknown or unreadable), record the fan-out's callback token the message carries, answer for
a task that already ended (``_ended``), give back the slots of a parked task whose worker
died before it did (``_gate.release_parked``), forward a task with a workspace to the pool whose hosts
can run its sandbox (``queueing.queues``: a runner without user namespaces never starts it), and
renew a message whose receives went to worker faults. The kind's handler goes on with the task
this returns."""

from __future__ import annotations

from agentq.core.errors import DETERMINISTIC_FAULTS, TaskNotFound
from agentq.core.models import Task
from agentq.queueing.dispatch import _ended, _gate, _poison
from agentq.queueing.dispatch._context import Action, Context, Delivery
from agentq.queueing.queues import TaskMessage


def receive(ctx: Context, message: TaskMessage, delivery: Delivery) -> Action | Task:
    """The Action when the message stops here, else the task to go on with."""
    try:
        task = ctx.store.tasks.get(message.task_id)
    except TaskNotFound:
        return _poison.unknown_task(message)
    except DETERMINISTIC_FAULTS as exc:  # stored as no code of ours can read it: every delivery would fail
        return _poison.unreadable_task(ctx, message, exc)
    if message.task_token and task.task_token != message.task_token:
        ctx.store.tasks.set_task_token(task.task_id, message.task_token)  # continuations carry no token
        task = task.model_copy(update={"task_token": message.task_token})
    if task.status.terminal:
        ended = _ended.answer_ended(ctx, task, delivery.tier, delivery.attributes)
        if isinstance(ended, Action):
            return ended
        task = ended
    task = _gate.release_parked(ctx, task)
    if ctx.queues.forwards(task.submission):
        # Sent to this pool by a path that does not route (a wake, a continuation of a release,
        # a sweep, a fan-out's child): the same body, to the same tier of the workspace pool.
        pool = ctx.queues.workspace_pool
        ctx.queues.send_body(
            delivery.tier, message.model_dump_json(exclude_defaults=True), tenant=task.tenant, pool=pool
        )
        return Action("delete", f"forwarded to the {pool} pool: the task has a workspace", task_id=task.task_id)
    if delivery.receive_count > ctx.max_receive_count:
        # Receives spent by worker faults (a killed or stopped holder, a duplicate waiting out a
        # live lease), not by the task's own failures, which are counted on its META
        # (``_failures``): a fresh copy (count 1) so SQS's redrive backstop never dead-letters a
        # healthy task.
        ctx.queues.send_body(delivery.tier, message.model_dump_json(exclude_defaults=True), tenant=task.tenant)
        return Action("delete", f"renewed after {delivery.receive_count} receives spent by worker faults",
                      task_id=task.task_id)  # fmt: skip
    return task
