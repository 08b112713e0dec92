"""One attempt at running the task, shared by every kind that runs it: the fair-share gate
(``_gate``), the engine's run (a deterministic fault fails the task at once, any other
exception is an outage retried like a provider's), the task's ending or its slots given back,
then the Action for the outcome (``_outcome``) and the note of a retry or a deferral (``_notes``)."""

from __future__ import annotations

import logging

from agentq import observe
from agentq.core.engine import RunResult
from agentq.core.errors import DETERMINISTIC_FAULTS, fault_error
from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch import _failures, _gate, _notes, _outcome
from agentq.queueing.dispatch._context import Action, Context, Delivery
from agentq.queueing.webhooks import enqueue_event

log = logging.getLogger("agentq.dispatch")


def run(ctx: Context, task: Task, delivery: Delivery) -> Action:
    gate, held_back = _gate.admit(ctx, task, delivery.tier)
    if held_back is not None:
        return held_back
    try:
        result = ctx.engine.run(task.task_id, deadline=delivery.deadline, keeper=delivery.keeper,
                                on_beat=delivery.on_beat, stop=delivery.stop, owner=delivery.owner)  # fmt: skip
    except DETERMINISTIC_FAULTS as exc:  # before the engine held a session (the claim's read)
        log.exception("task %s cannot run", task.task_id)
        result = _failures.fail(ctx, task, fault_error(exc))
    except Exception as exc:  # an outage, or a fault of no known kind: retried, a bounded number of times
        log.exception("task %s: run failed", task.task_id)
        result = RunResult(task.task_id, "retry", error=fault_error(exc, code="worker_error"))
    observe.record_run(result)
    give_back = _gate.give_back(ctx, task, gate)
    if result.status is not None and result.status.terminal:
        ctx.end(task, result.status, give_back=give_back)  # an ended task left running: its slots go back
    else:
        if give_back is not None and _gate.left_running(gate, result):
            give_back()
        if result.status is TaskStatus.IDLE:
            _report_idle(ctx, task)
    action = _outcome.after_run(ctx, result, tier=delivery.tier, receive_count=delivery.receive_count,
                                tenant=task.tenant, give_back=give_back)  # fmt: skip
    if result.outcome == "retry" and action.kind == "retry":
        _notes.note_retry(ctx, task, result, action)
    if result.outcome == "deferred":
        _notes.note_deferral(ctx, task, result)
    return action


def _report_idle(ctx: Context, task: Task) -> None:
    """An interrupted conversation stopped and waits for a message: its ``idle`` callback."""
    try:
        enqueue_event(ctx.queues, task.model_copy(update={"status": TaskStatus.IDLE}), "idle")
    except Exception:  # as for an end: a callback that cannot be queued holds nothing up
        log.warning("could not queue the idle callback of task %s", task.task_id, exc_info=True)
