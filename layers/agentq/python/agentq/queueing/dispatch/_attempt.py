"""One attempt at running the task, shared by every kind that runs it: the stops of its tenant
(a task in a stopped scope is cancelled, never run: ``core.stops``), the fair-share gate
(``_gate``), the engine's run (a deterministic fault fails the task at once, any other
exception is an outage retried like a provider's), the task's ending or its slots given back,
then the Action for the outcome (``_outcome``) and the note of a retry or a deferral (``_notes``)."""

from __future__ import annotations

import contextlib
import logging

from agentq import observe
from agentq.core.engine import RunResult
from agentq.core.errors import DETERMINISTIC_FAULTS, IllegalTransition, TaskNotFound, fault_error
from agentq.core.models import Task, TaskStatus
from agentq.core.stops import stop_covering
from agentq.queueing.a2a_push import enqueue_push
from agentq.queueing.dispatch import _ended, _failures, _gate, _notes, _outcome
from agentq.queueing.dispatch._context import Action, Context, Delivery
from agentq.queueing.webhooks import enqueue_event

log = logging.getLogger("agentq.dispatch")


def run(ctx: Context, task: Task, delivery: Delivery) -> Action:
    stopped = _stopped(ctx, task, delivery)
    if stopped is not None:
        return stopped
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
        if result.status in (TaskStatus.PAUSED, TaskStatus.IDLE):
            _push(ctx, task, result.status)
    action = _outcome.after_run(ctx, result, tier=delivery.tier, receive_count=delivery.receive_count,
                                tenant=task.tenant, give_back=give_back)  # fmt: skip
    if result.outcome == "retry" and action.kind == "retry":
        _notes.note_retry(ctx, task, result, action)
    if result.outcome == "deferred":
        _notes.note_deferral(ctx, task, result)
    return action


def _stopped(ctx: Context, task: Task, delivery: Delivery) -> Action | None:
    """None when no stop of its tenant covers ``task``; else it is cancelled with its subtree
    (``control``'s cancel, handed in) and its end reported as a message of an ended task's is
    (a fan-out parent told). Read before every claim, so a task the stop's listing could not see
    (created or claimed after the stop was stored) never commits a step (ARCHITECTURE 17)."""
    stop = stop_covering(ctx.store.stops.list(task.tenant), task)
    if stop is None:
        return None
    if ctx.fair.cancel is None:  # a composition fault: the worker cannot honour the stop
        raise RuntimeError("the dispatcher was built without control's cancel")
    with contextlib.suppress(IllegalTransition, TaskNotFound):  # it ended meanwhile
        ctx.fair.cancel(ctx.store, task.task_id, tenant=task.tenant, reason=f"stopped: {stop.scope}",
                        queues=ctx.queues, slots=ctx.fair.slots)  # fmt: skip
    log.info("task %s: not run, %s is stopped", task.task_id, stop.scope)
    ended = ctx.store.tasks.get(task.task_id)
    if not ended.status.terminal:  # claimed and ended differently meanwhile? the next delivery decides
        return Action("retry", "its stop's cancel did not end it", delay_seconds=1, task_id=task.task_id)
    answer = _ended.answer_ended(ctx, ended, delivery.tier, None)
    assert isinstance(answer, Action)  # a cancelled task is never a redrive's
    return answer


def _push(ctx: Context, task: Task, status: TaskStatus) -> None:
    """A task of an agent waits for someone: its push configs are told (input-required)."""
    try:
        enqueue_push(ctx.store, ctx.queues, task, status)
    except Exception:  # as for a callback: a notification that cannot be queued holds nothing up
        log.warning("could not queue the push notifications of task %s", task.task_id, exc_info=True)


def _report_idle(ctx: Context, task: Task) -> None:
    """An interrupted conversation stopped and waits for a message: its ``idle`` callback."""
    try:
        enqueue_event(ctx.queues, task.model_copy(update={"status": TaskStatus.IDLE}), "idle")
    except Exception:  # as for an end: a callback that cannot be queued holds nothing up
        log.warning("could not queue the idle callback of task %s", task.task_id, exc_info=True)
