"""``schedule``: a schedule's fire, delivered by EventBridge Scheduler (the fire time filled in
by it): submit its task, once per fire time whatever the deliveries. The fire itself is
``control``'s (``control.schedules.fire``), handed in as the context's ``fire_schedule``.

A fire whose stored submission is refused (a ValidationError, an agent gone, a fault another
delivery would meet again) is poison: retrying it until SQS gives up only repeats the refusal,
so it goes to the DLQ at once with the reason (``fire`` has counted it on the schedule). An
outage propagates, and the message comes back."""

from __future__ import annotations

from datetime import datetime

from agentq.core.errors import DETERMINISTIC_FAULTS, AgentqError, fault_error
from agentq.queueing.dispatch._context import Action, Context
from agentq.queueing.queues import TaskMessage

REFUSED: tuple[type[Exception], ...] = (AgentqError, *DETERMINISTIC_FAULTS)  # as ``control.schedules.REFUSED``


def handle(ctx: Context, message: TaskMessage) -> Action:
    tenant, _, name = (message.schedule or "").partition("#")
    try:
        at = datetime.fromisoformat((message.scheduled_time or "").replace("Z", "+00:00")).timestamp()
    except ValueError:
        return Action("dead_letter", f"poison: a schedule message with no valid time ({message.scheduled_time!r})")
    if not tenant or not name:
        return Action("dead_letter", f"poison: a schedule message naming no schedule ({message.schedule!r})")
    try:
        task_id = ctx.fire_schedule(ctx.store, ctx.engine.tools, ctx.queues, tenant=tenant, name=name, fire_time=at)
    except REFUSED as exc:
        return Action("dead_letter", f"poison: schedule {name}: {fault_error(exc)['message']}")
    return Action("delete", f"schedule {name} fired: {task_id or 'skipped'}", task_id=task_id)
