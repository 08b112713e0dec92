"""What becomes of the message after a run: the follow-up messages the run asked for (a batch's
next look, an approval's timer, a lost lease's hold), then the ``Action`` for its outcome.
Every follow-up carries the task's tenant as its fair-queue group."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agentq.core.engine import RunResult
from agentq.queueing.dispatch import _failures
from agentq.queueing.dispatch._context import MAX_VISIBILITY, PARKED, Action, Context


def after_run(
    ctx: Context, run: RunResult, *, tier: str, receive_count: int, tenant: str, give_back: Callable[[], object] | None
) -> Action:
    """``give_back``: the slots the run's gate took (a last attempt's failure ends the task)."""
    task_id = run.task_id
    if run.batch_poll is not None:
        ctx.send_later(task_id, tier, "batch_poll", run.batch_poll, tenant=tenant)
    if run.remote_poll is not None:
        ctx.send_later(task_id, tier, "remote_poll", run.remote_poll, tenant=tenant)
    if run.approval_due is not None:
        ctx.send_later(task_id, tier, "approval_due", run.approval_due - time.time(), tenant=tenant)
    if run.lapsed_until is not None:  # ended or parked with a lost lease's call maybe still in flight
        ctx.send_later(task_id, tier, "release_holds", run.lapsed_until - time.time(), tenant=tenant)
    if run.outcome in ("finished", "stopped", "waiting"):
        return Action("delete", f"task {run.status.value if run.status else 'ended'}", task_id=task_id, run=run)
    if run.outcome == "continue":
        ctx.queues.send(task_id, tier, kind="continue", tenant=tenant)
        return Action("delete", "time slice used; continuation sent", task_id=task_id, run=run)
    if run.outcome == "deferred":
        # A zombie's call may still be charged against the budget: come back after its hold's
        # deadline. A fresh delayed message, not a visibility change, so waiting spends none of
        # the task's receives (SQS caps a message's delay at 15 minutes; a longer wait defers again).
        ctx.send_later(task_id, tier, "continue", (run.error or {}).get("retry_after") or 1, tenant=tenant)
        why = (run.error or {}).get("message") or "deferred"
        return Action("delete", f"deferred: {why}", task_id=task_id, run=run)
    if run.outcome == "stopping":
        # A stop's mark fenced the run; the task ends with the stop's move to cancelled. A fresh
        # delayed message (no note: a logged write would refuse that move) looks again: it ends
        # the task's message then, or cancels the task, or runs it on (a dead stop, resumed).
        wait = (run.error or {}).get("retry_after") or 1
        ctx.send_later(task_id, tier, "continue", wait, tenant=tenant)
        return Action("delete", f"being stopped; looked at again in {wait} s", task_id=task_id, run=run)
    if run.outcome == "lease_lost":
        # Another worker owns the task now (with this very message, if our visibility lapsed): touch nothing.
        return Action("abandon", "lease lost to another worker", task_id=task_id, run=run)
    if run.outcome == "retry":
        return _failures.retry_or_dead_letter(ctx, run, give_back=give_back)
    return _not_claimed(ctx, run, receive_count=receive_count)


def _not_claimed(ctx: Context, run: RunResult, *, receive_count: int) -> Action:
    """Someone holds a live lease, or the task moved on since we looked."""
    task_id = run.task_id
    task = ctx.store.tasks.get(task_id)
    if task.status.terminal or task.status in PARKED:
        return Action("delete", f"task already {task.status.value}", task_id=task_id, run=run)
    if _held_by_live_worker(ctx, task_id):
        # Its worker process is alive (the claim just asked) and holds the task's own message,
        # which a peer makes visible again if that worker dies (queueing.recovery): this copy
        # is not needed, and coming back for it would only wait out the long backstop lease.
        return Action("delete", "duplicate of a message held by a live worker", task_id=task_id, run=run)
    remaining = task.lease_expires - time.time()
    if receive_count >= ctx.max_receive_count:
        # A duplicate of a message a live worker holds: that worker's own message is
        # the task's lifeline, so this copy must not end up failing the task from the DLQ.
        return Action("delete", "duplicate of a message held by a live worker", task_id=task_id, run=run)
    # Come back just after the lease would lapse: if its holder died, we take over then.
    return Action("retry", "task leased by another worker", delay_seconds=min(MAX_VISIBILITY, max(1, int(remaining) + 1)),
                  task_id=task_id, run=run)  # fmt: skip


def _held_by_live_worker(ctx: Context, task_id: str) -> bool:
    """Is the task held under a worker process's liveness that has not lapsed?"""
    metas = ctx.store.tasks.metas([task_id])
    owner = _owner_of(metas[0]) if metas else None
    return owner is not None and not ctx.store.tasks.workers.lapsed(*owner)


def _owner_of(meta: dict[str, Any]) -> tuple[str, int] | None:
    worker, epoch = meta.get("owner_worker"), meta.get("owner_epoch")
    return None if worker is None or epoch is None else (str(worker), int(epoch))
