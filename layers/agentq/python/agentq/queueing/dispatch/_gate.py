"""Fair share at the dispatcher: the gate before a run (``queueing.fairness.FairShare.admit``)
and the slots a run gives back when its task leaves ``running``.

A task over its tenant's, its key's or the fleet's limit is parked and its message deleted (it
waits ``queued`` and costs nothing until a slot frees); one neither admitted nor parked keeps its
message (a retry in a second); one its key's ``skip`` ended is reported as any end. A
reserved-concurrency executor that meets a full tenant thus deletes the message instead of
retrying it.
"""

from __future__ import annotations

from collections.abc import Callable

from agentq.core.engine import RunResult
from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch._context import Action, Context
from agentq.queueing.fairness import Gate


def admit(ctx: Context, task: Task, tier: str) -> tuple[Gate, Action | None]:
    """The gate, and the Action when the task may not run now (None: run it)."""
    gate = ctx.fair.admit(task, tier)
    if gate.skipped:
        ctx.end(ctx.store.tasks.get(task.task_id), TaskStatus.CANCELLED)
    if gate.waits is not None:
        return gate, Action("delete", gate.waits, task_id=task.task_id)
    if gate.keep is not None:
        return gate, Action("retry", gate.keep, delay_seconds=1, task_id=task.task_id)
    return gate, None


def give_back(ctx: Context, task: Task, gate: Gate) -> Callable[[], object] | None:
    """How the run's task gives back the slots its gate took (None: it took none)."""
    if not gate.limited:
        return None
    return lambda: ctx.fair.release(task.task_id)


def left_running(gate: Gate, run: RunResult) -> bool:
    """The run's task holds slots and left ``running`` (ended, idle, waiting for its children,
    paused for an approval, or failed retryably): its slots go back now."""
    return gate.limited and run.status not in (TaskStatus.RUNNING, TaskStatus.QUEUED)
