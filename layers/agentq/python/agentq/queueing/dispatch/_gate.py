"""Fair share at the dispatcher: the gate before a run (``queueing.fairness.FairShare.admit``)
and the slots a run gives back when its task leaves ``running``.

A task over its tenant's, its key's or the fleet's limit is parked and its message deleted (it
waits ``queued`` and costs nothing until a slot frees); one neither admitted nor parked keeps its
message (a retry in a second); one its key's ``skip`` ended is reported as any end. A
reserved-concurrency executor that meets a full tenant thus deletes the message instead of
retrying it.

A task parked ``waiting``, ``paused`` or ``idle`` holds no slot (ARCHITECTURE 12): its run's
worker gives them back after the run returns. A worker killed between the park and that release
leaves the task naming slots nobody else gives back (a parent until its children end, which
need them; an approval until decided; an idle conversation maybe never), so whatever message
of the task comes next (the dead worker's own, made visible by the liveness hand-off) gives
them back first (``release_parked``), as one for an ended task does (``_ended``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agentq.core.engine import RunResult
from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch._context import PARKED, Action, Context
from agentq.queueing.fairness import Gate

log = logging.getLogger("agentq.dispatch")


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


def release_parked(ctx: Context, task: Task) -> Task:
    """``task`` as it is once a parked task's slots are given back (see the module); ``task``
    itself when it is not parked or names none (nothing read, nothing written). The release is
    idempotent and conditional on the task being neither ``queued`` nor ``running`` when it
    lands, so racing its own worker's release, or a wake that requeued it meanwhile (which
    then keeps its slots and runs on them), gives nothing back twice and takes none from a
    task that runs; read again after it, so the caller never acts on slots it no longer holds."""
    if task.status not in PARKED or not task.slots:
        return task
    freed = ctx.fair.release(task.task_id)
    if freed:
        log.warning("task %s was %s still holding slots %s (its worker died before releasing them): given back",
                    task.task_id, task.status.value, ", ".join(freed))  # fmt: skip
    return ctx.store.tasks.get(task.task_id)
