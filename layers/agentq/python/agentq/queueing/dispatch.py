"""What to do with one queue message: the policy shared by the Lambda executor and the worker.

``Dispatcher.handle`` runs the task the message names and answers with an ``Action`` the
adapter carries out on SQS: delete it, return it later (retry with backoff), move it to the
DLQ, or leave it alone. Failure classes:

- retryable (provider overload, throttling): the message comes back with exponential backoff;
  on the last allowed receive the task is marked ``failed`` with the error and the message
  goes to the DLQ, from where a redrive resumes it at its checkpoint, out of that failure only
  (its id, META's ``dead_letter``, rides on the dead letter: ``_requeue_redriven``); a delivery
  that finds the task failed by another (a duplicate) deletes its copy instead;
- permanent (bad request, budget, caps): the engine ends the task; the message is deleted;
- deterministic (``DETERMINISTIC_FAULTS``: a script that cannot load, a submission or step that
  no longer validates, a bug every run meets): the task ends ``failed`` with the error at once
  and its parent is told, never retried until SQS dead-letters a task whose status says running;
- poison (not JSON, not a task message, unknown task, a task that cannot be read): straight to
  the DLQ with the reason.

Any other exception escaping a run (an outage) is a retryable failure like a provider's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pydantic

from agentq import observe
from agentq.core.engine import Engine, KeeperFactory, RunResult, batch_poll_seconds
from agentq.core.errors import DETERMINISTIC_FAULTS, IllegalTransition, ProviderError, TaskNotFound, fault_error
from agentq.core.models import RetryState, Task, TaskStatus
from agentq.core.providers.base import BatchProvider
from agentq.core.records import ClaimOwner
from agentq.queueing.dependencies import release_dependents
from agentq.queueing.fairness import FairShare
from agentq.queueing.queues import DEAD_LETTER_ID, DEAD_LETTER_REASON, TaskMessage, TaskQueues
from agentq.queueing.webhooks import enqueue_end, enqueue_event
from agentq.storage.container import Storage

log = logging.getLogger("agentq.dispatch")

ActionKind = Literal["delete", "retry", "dead_letter", "abandon"]
MAX_VISIBILITY = 12 * 3600
MAX_DELAY = 900  # SQS DelaySeconds limit


@dataclass
class Action:
    kind: ActionKind
    reason: str = ""
    delay_seconds: int = 0
    task_id: str | None = None
    run: RunResult | None = None
    attempts: int = 0  # a retry: the task's own failures so far (not the message's receives)
    dead_letter_id: str | None = None  # a dead letter whose task this failed: which failure (META's ``dead_letter``)


@dataclass(frozen=True)
class RetryBackoff:
    """Exponential backoff with full jitter for retryable failures, in whole seconds (SQS)."""

    base_seconds: float = 2.0
    cap_seconds: float = 900.0

    def delay(self, receive_count: int, rng: random.Random | None = None) -> int:
        ceiling = min(self.cap_seconds, self.base_seconds * 2 ** max(0, receive_count - 1))
        return max(1, int((rng or random).uniform(ceiling / 2, ceiling)))


class Dispatcher:
    def __init__(
        self,
        engine: Engine,
        store: Storage,
        queues: TaskQueues,
        *,
        max_receive_count: int,
        backoff: RetryBackoff = RetryBackoff(),
        default_max_running: int | None = None,
        fleet_capacity: int | None = None,
    ) -> None:
        """``default_max_running``: the most running tasks per tenant without an override of
        its own (the deployment's ``AGENTQ_DEFAULT_TENANT_MAX_RUNNING``; None: unlimited).
        ``fleet_capacity``: the most running tasks of all tenants, shared by weight when full
        (``AGENTQ_FLEET_CAPACITY``; None: no fleet slot)."""
        self.engine = engine
        # The whole store, not engine.store (the engine's ports): the dispatcher also records task
        # tokens and wakes spawns, which the engine never does.
        self.store = store
        self.queues = queues
        self.max_receive_count = max_receive_count
        self.backoff = backoff
        self.fair = FairShare(store, queues, default_limit=default_max_running, fleet_capacity=fleet_capacity)

    def handle(
        self,
        body: str,
        *,
        tier: str,
        receive_count: int,
        attributes: dict[str, Any] | None = None,
        deadline: float | None = None,
        keeper: KeeperFactory | None = None,
        on_beat: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
        owner: ClaimOwner | None = None,
    ) -> Action:
        try:
            message = TaskMessage.model_validate_json(body)
        except pydantic.ValidationError as exc:
            return Action("dead_letter", f"poison: not a task message ({exc.errors()[0]['msg']})")
        if message.kind == "schedule":
            return self._fire(message)
        with observe.task_context(task_id=message.task_id):
            return self._handle(
                message, tier=tier, receive_count=receive_count, attributes=attributes,
                deadline=deadline, keeper=keeper, on_beat=on_beat, stop=stop, owner=owner,
            )  # fmt: skip

    def _fire(self, message: TaskMessage) -> Action:
        """A schedule's fire, delivered by EventBridge Scheduler: submit its task (once per
        fire time, whatever the deliveries)."""
        from datetime import datetime

        from agentq.control.schedules import fire

        tenant, _, name = (message.schedule or "").partition("#")
        try:
            at = datetime.fromisoformat((message.scheduled_time or "").replace("Z", "+00:00")).timestamp()
        except ValueError:
            return Action("dead_letter", f"poison: a schedule message with no valid time ({message.scheduled_time!r})")
        if not tenant or not name:
            return Action("dead_letter", f"poison: a schedule message naming no schedule ({message.schedule!r})")
        task_id = fire(self.store, self.engine.tools, self.queues, tenant=tenant, name=name, fire_time=at)
        return Action("delete", f"schedule {name} fired: {task_id or 'skipped'}", task_id=task_id)

    def _handle(
        self,
        message: TaskMessage,
        *,
        tier: str,
        receive_count: int,
        attributes: dict[str, Any] | None,
        deadline: float | None,
        keeper: KeeperFactory | None,
        on_beat: Callable[[], None] | None,
        stop: threading.Event | None,
        owner: ClaimOwner | None,
    ) -> Action:
        try:
            task = self.store.tasks.get(message.task_id)
        except TaskNotFound:
            return Action("dead_letter", f"poison: unknown task {message.task_id!r}", task_id=message.task_id)
        except DETERMINISTIC_FAULTS as exc:  # stored as no code of ours can read it: every delivery would fail
            return self._unreadable(message, exc)

        if message.task_token and task.task_token != message.task_token:
            self.store.tasks.set_task_token(task.task_id, message.task_token)  # continuations carry no token
            task = task.model_copy(update={"task_token": message.task_token})
        if task.status.terminal:
            if not (task.status is TaskStatus.FAILED and _was_dead_lettered(attributes)):
                self._report_end(task, task.status)  # a redelivery after a crash before the report
                if task.lapsed_holds:
                    self._release_lapsed(task, tier)
                # A crash between its end and the release; or, holding none, it may have been
                # woken for a slot and ended (cancelled) before this message: pass the wake on.
                if not self.fair.release(task.task_id):
                    self.fair.pass_on(task)
                return Action("delete", f"task already {task.status.value}", task_id=task.task_id)
            if not self._requeue_redriven(task, attributes):
                task = self.store.tasks.get(task.task_id)
                if task.status.terminal:  # a copy of an older redrive: the task failed again since
                    return Action(
                        "delete",
                        f"task {task.status.value} again since this dead letter was redriven; "
                        "its later dead letter is the one to redrive",
                        task_id=task.task_id,
                    )
        if receive_count > self.max_receive_count:
            # Receives spent by worker faults (a killed or stopped holder, a duplicate waiting
            # out a live lease), not by the task's own failures, which are counted on its META:
            # a fresh copy (count 1) so SQS's redrive backstop never dead-letters a healthy task.
            self.queues.send_body(tier, message.model_dump_json(exclude_defaults=True), tenant=task.tenant)
            return Action(
                "delete", f"renewed after {receive_count} receives spent by worker faults", task_id=task.task_id
            )
        if message.kind == "approval_due":
            if not self._approval_due(task, tier):
                return Action("delete", "no approval to time out, or not yet", task_id=task.task_id)
            task = self.store.tasks.get(task.task_id)
        if message.kind == "batch_poll":
            if not self._batch_ended(task, tier):
                return Action("delete", "no batch to look at, or it has not ended yet", task_id=task.task_id)
            task = self.store.tasks.get(task.task_id)
        elif message.kind == "wake" and message.spawn_id:
            self._wake(task, message.spawn_id)
        elif task.status in (TaskStatus.WAITING, TaskStatus.PAUSED, TaskStatus.IDLE):
            return Action(
                "delete", f"task is {task.status.value}; it is woken by its own message", task_id=task.task_id
            )

        gate = self.fair.admit(task, tier)
        if gate.skipped:
            self._report_end(self.store.tasks.get(task.task_id), TaskStatus.CANCELLED)
        if gate.waits is not None:
            return Action("delete", gate.waits, task_id=task.task_id)
        if gate.keep is not None:
            return Action("retry", gate.keep, delay_seconds=1, task_id=task.task_id)
        try:
            run = self.engine.run(
                task.task_id, deadline=deadline, keeper=keeper, on_beat=on_beat, stop=stop, owner=owner
            )
        except DETERMINISTIC_FAULTS as exc:  # before the engine held a session (the claim's read)
            log.exception("task %s cannot run", task.task_id)
            run = self._fail(task, fault_error(exc))
        except Exception as exc:  # an outage, or a fault of no known kind: retried, a bounded number of times
            log.exception("task %s: run failed", task.task_id)
            run = RunResult(task.task_id, "retry", error=fault_error(exc, code="worker_error"))
        observe.record_run(run)
        if gate.limited and run.status not in (TaskStatus.RUNNING, TaskStatus.QUEUED):
            self.fair.release(task.task_id)
        if run.status is not None and run.status.terminal:
            self._report_end(task, run.status)
        elif run.status is TaskStatus.IDLE:
            self._report_idle(task)
        action = self._after_run(run, tier=tier, receive_count=receive_count, tenant=task.tenant)
        if gate.limited and run.outcome == "retry" and action.kind != "retry":
            self.fair.release(task.task_id)  # out of retries: failed only now, by _after_run (or by a duplicate)
        if run.outcome == "retry" and action.kind == "retry":
            self._note_retry(task, run, action)
        if run.outcome == "deferred":
            self._note_deferral(task, run)
        return action

    def _note_deferral(self, task: Task, run: RunResult) -> None:
        """The run put the task off before its call (an open circuit, a 429's slow-down, a spent
        rate bucket, a lost lease's call in flight): record why and until when, so its status
        names the deferral instead of an older retry whose time has passed (best effort)."""
        error = run.error or {}
        self._note(task, run, "deferral", attempt=1, max_attempts=1, code=error.get("code") or "deferred",
                   message=error.get("message") or "deferred", delay=float(error.get("retry_after") or 1))  # fmt: skip

    def _note_retry(self, task: Task, run: RunResult, action: Action) -> None:
        """The task comes back in ``action.delay_seconds``: record why and when, so its status
        says so instead of "running" with no error (best effort: the retry happens anyway)."""
        error = run.error or {}
        self._note(task, run, "delivery", attempt=action.attempts, max_attempts=self.max_receive_count,
                   code=error.get("code") or "retryable_error", message=error.get("message") or action.reason,
                   delay=action.delay_seconds, status_code=error.get("status_code"))  # fmt: skip

    def _note(
        self,
        task: Task,
        run: RunResult,
        scope: Literal["delivery", "deferral"],
        *,
        attempt: int,
        max_attempts: int,
        code: Any,
        message: Any,
        delay: float,
        status_code: int | None = None,
    ) -> None:
        """Record on the task (META#RETRY) what will bring it back, and when: for the step after
        the ones this run committed."""
        now = time.time()
        base = run.claimed or task
        state = RetryState(
            step=base.step + run.steps_committed + 1,
            scope=scope,
            attempt=attempt,
            max_attempts=max_attempts,
            code=str(code)[:64],
            message=str(message)[:500],
            status_code=status_code,
            at=now,
            next_at=now + delay,
        )
        try:
            self.store.tasks.record_retry(task.task_id, state)
        except Exception:
            log.warning("could not record the %s of task %s", scope, task.task_id, exc_info=True)

    def _fail(self, task: Task, error: dict[str, Any]) -> RunResult:
        """End ``task`` ``failed`` with ``error`` outside any lease (no run holds one)."""
        try:
            self.store.tasks.transition(task.task_id, TaskStatus.FAILED, error=error)
        except IllegalTransition:  # it ended meanwhile (a cancel): that end stands
            current = self.store.tasks.get(task.task_id)
            return RunResult(task.task_id, "finished", status=current.status, error=current.error)
        return RunResult(task.task_id, "finished", status=TaskStatus.FAILED, error=error)

    def _unreadable(self, message: TaskMessage, exc: Exception) -> Action:
        """A task whose stored items no longer validate: failed (its META can still be written),
        its parent told through the message's token, and the message dead-lettered with why."""
        log.exception("task %s cannot be read", message.task_id)
        error = {**fault_error(exc, code="unreadable_task"), "dead_lettered": True}
        try:
            self.store.tasks.transition(message.task_id, TaskStatus.FAILED, error=error)
        except Exception:  # the condition failed and reading the task to say why failed again
            log.warning("task %s could not be marked failed", message.task_id)
        # Its slots are read from the raw META (no model): a failed task gives them back.
        self.fair.release(message.task_id)
        if message.task_token and self.engine.fanout is not None:
            self.engine.fanout.child_finished(message.task_token, message.task_id, TaskStatus.FAILED)
        return Action("dead_letter", f"poison: {error['message']}", task_id=message.task_id)

    def _wake(self, task: Task, spawn_id: str) -> None:
        """The fan-out ended: note it on the spawn and make the parent runnable again."""
        self.store.spawns.mark(task.task_id, spawn_id, woken=True)
        # Refused when still running (it parks itself and this message comes back) or already queued.
        with contextlib.suppress(IllegalTransition):
            self.store.tasks.transition(task.task_id, TaskStatus.QUEUED)

    def _report_end(self, task: Task, status: TaskStatus) -> None:
        """A child of a fan-out reports its end through its Step Functions callback token; the
        tasks that wait for this one (``depends_on``) are looked at."""
        token = task.task_token or self.store.tasks.get(task.task_id).task_token
        if token and self.engine.fanout is not None:
            self.engine.fanout.child_finished(token, task.task_id, status)
        try:
            enqueue_end(self.queues, task, status)
        except Exception:  # a callback that cannot be queued never holds up the task's end
            log.warning("could not queue the callback of task %s", task.task_id, exc_info=True)
        release_dependents(self.store, self.queues, task.task_id)

    def _report_idle(self, task: Task) -> None:
        """An interrupted conversation stopped and waits for a message: its ``idle`` callback."""
        try:
            enqueue_event(self.queues, task.model_copy(update={"status": TaskStatus.IDLE}), "idle")
        except Exception:  # as for an end: a callback that cannot be queued holds nothing up
            log.warning("could not queue the idle callback of task %s", task.task_id, exc_info=True)

    def _requeue_redriven(self, task: Task, attributes: dict[str, Any] | None) -> bool:
        """A message back from the DLQ for a task we failed: the operator wants it resumed, out
        of the failure it was dead-lettered for (its ``agentq-dead-letter``), and out of no later
        one: SQS may deliver the redriven message again after the resumed task failed once more
        and was dead-lettered again, and that copy must not resume it (the task would run while
        the DLQ lists it failed). A message without the attribute (dead-lettered before it
        existed, or by hand) resumes whatever failure the task is in. False when not requeued."""
        failure = _dead_letter_id(attributes)
        try:
            self.store.tasks.transition(
                task.task_id,
                TaskStatus.QUEUED,
                error=None,
                reopen=True,
                expect={"dead_letter": failure} if failure else None,
            )
        except IllegalTransition:
            return False  # another copy of the redrive requeued it (the claim below decides), or a later failure
        log.info("redrive: task %s requeued from its checkpoint (step %s)", task.task_id, task.step)
        return True

    def _held_by_live_worker(self, task_id: str) -> bool:
        """Is the task held under a worker process's liveness that has not lapsed?"""
        metas = self.store.tasks.metas([task_id])
        owner = _owner_of(metas[0]) if metas else None
        return owner is not None and not self.store.tasks.workers.lapsed(*owner)

    def _count_failure(self, run: RunResult) -> int:
        """This retryable failure, counted on the task (at the step it failed on): the attempts
        so far. A worker fault never gets here, so it never counts."""
        claimed = run.claimed
        step = (claimed.step if claimed else 0) + run.steps_committed + 1
        try:
            return self.store.tasks.record_failure(run.task_id, step)
        except TaskNotFound:
            return self.max_receive_count  # gone: nothing left to retry

    def _release_lapsed(self, task: Task, tier: str) -> None:
        """An ended task still holding an older epoch's hold: count it as spent once its call
        can no longer complete, coming back for it with a delayed message until then."""
        wait = self.engine.spend_lapsed_holds(task)
        if wait > 0:
            wait_s = min(MAX_DELAY, math.ceil(wait))
            self.queues.send(task.task_id, tier, kind="release_holds", delay_seconds=wait_s, tenant=task.tenant)

    def _batch_ended(self, task: Task, tier: str) -> bool:
        """The poller of economy mode: a task waiting on a batch looks at it on a delayed message
        of its own (no table scan, nothing to schedule). Ended (or failed: the run reads why):
        the task is queued and runs now. Not yet: the next look is set, later as the batch ages."""
        batch = task.batch
        if task.status is not TaskStatus.WAITING or not batch:
            return False
        provider = self.engine.providers(task.submission)
        try:
            ended = not isinstance(provider, BatchProvider) or (
                provider.batch_result(str(batch["id"]), str(batch["custom_id"])) is not None
            )
        except ProviderError:
            ended = True  # the run meets the same error and handles it
        if not ended:
            wait = batch_poll_seconds(batch)
            self.queues.send(
                task.task_id,
                tier,
                kind="batch_poll",
                delay_seconds=min(MAX_DELAY, max(1, math.ceil(wait))),
                tenant=task.tenant,
            )
            return False
        with contextlib.suppress(IllegalTransition):
            self.store.tasks.transition(task.task_id, TaskStatus.QUEUED)
        return True

    def _approval_due(self, task: Task, tier: str) -> bool:
        """A paused task's approval timer fired: past its timeout, the approval takes the
        task's ``approval_default`` (recorded as decided by ``timeout``, on the same condition
        a person's decision has, so exactly one of them wins) and the task runs on with it.
        Not yet due (SQS delays at most 15 minutes): the timer is set again."""
        constraints = task.submission.constraints
        timeout = constraints.approval_timeout_seconds
        pending = self.store.approvals.pending(task.task_id) if task.status is TaskStatus.PAUSED else None
        if pending is None or timeout is None:
            return False
        wait = pending.asked_at + timeout - time.time()
        if wait > 0:
            wait_s = min(MAX_DELAY, math.ceil(wait))
            self.queues.send(task.task_id, tier, kind="approval_due", delay_seconds=wait_s, tenant=task.tenant)
            return False
        note = f"no decision within {timeout}s; the default ({constraints.approval_default}) applies"
        try:
            self.store.approvals.decide(
                task.task_id,
                pending.use_id,
                approved=constraints.approval_default == "approve",
                note=note,
                by="timeout",
            )
        except IllegalTransition:  # a person decided first: their decision stands, their message runs it
            return False
        log.info("task %s: approval %s timed out: %s", task.task_id, pending.use_id, note)
        return True

    def _after_run(self, run: RunResult, *, tier: str, receive_count: int, tenant: str) -> Action:
        """What becomes of the message after a run; every follow-up message it sends carries
        the task's ``tenant`` as its fair-queue group."""
        task_id = run.task_id
        if run.batch_poll is not None:
            delay = min(MAX_DELAY, max(1, math.ceil(run.batch_poll)))
            self.queues.send(task_id, tier, kind="batch_poll", delay_seconds=delay, tenant=tenant)
        if run.approval_due is not None:
            wait = run.approval_due - time.time()
            delay = min(MAX_DELAY, max(1, math.ceil(wait)))
            self.queues.send(task_id, tier, kind="approval_due", delay_seconds=delay, tenant=tenant)
        if run.lapsed_until is not None:  # ended with a lost lease's call maybe still in flight
            wait = run.lapsed_until - time.time()
            delay = min(MAX_DELAY, max(1, math.ceil(wait)))
            self.queues.send(task_id, tier, kind="release_holds", delay_seconds=delay, tenant=tenant)
        if run.outcome in ("finished", "stopped", "waiting"):
            return Action("delete", f"task {run.status.value if run.status else 'ended'}", task_id=task_id, run=run)
        if run.outcome == "continue":
            self.queues.send(task_id, tier, kind="continue", tenant=tenant)
            return Action("delete", "time slice used; continuation sent", task_id=task_id, run=run)
        if run.outcome == "deferred":
            # A zombie's call may still be charged against the budget: come back after its
            # hold's deadline. A fresh delayed message, not a visibility change, so waiting
            # spends none of the task's receives (SQS caps a message's delay at 15 minutes;
            # a longer wait defers again).
            wait = (run.error or {}).get("retry_after") or 1
            self.queues.send(
                task_id, tier, kind="continue", delay_seconds=min(MAX_DELAY, math.ceil(wait)), tenant=tenant
            )
            why = (run.error or {}).get("message") or "deferred"
            return Action("delete", f"deferred: {why}", task_id=task_id, run=run)
        if run.outcome == "lease_lost":
            # Another worker owns the task now (with this very message, if our visibility
            # lapsed): touch nothing.
            return Action("abandon", "lease lost to another worker", task_id=task_id, run=run)
        if run.outcome == "retry":
            error = run.error or {}
            attempts = self._count_failure(run)
            if attempts >= self.max_receive_count:
                reason = f"failed after {attempts} attempts: {error.get('message', 'retryable error')}"
                failure = uuid.uuid4().hex  # this failure, on META and on its dead letter
                # dead_lettered: what a person is told to do with it (redrive, not only fork)
                failed = {**error, "attempts": attempts, "dead_lettered": True}
                try:
                    self.store.tasks.transition(
                        task_id, TaskStatus.FAILED, error=failed, extra={"dead_letter": failure}
                    )
                except IllegalTransition:
                    # Not ours to fail: another delivery of the task (a duplicate that claimed it
                    # once this run gave its lease back) failed it and dead-lettered its own
                    # message, or it ended, paused or went idle meanwhile. A second dead letter
                    # would be listed and redriven as another failure: this copy is deleted.
                    now = self.store.tasks.get(task_id).status
                    return Action("delete", f"task {now.value} meanwhile: {reason}", task_id=task_id, run=run)
                run.status = TaskStatus.FAILED
                self._report_end(self.store.tasks.get(task_id), TaskStatus.FAILED)  # its parent wakes
                return Action("dead_letter", reason, task_id=task_id, run=run, dead_letter_id=failure)
            delay = int(error.get("retry_after") or self.backoff.delay(attempts))
            return Action(
                "retry",
                f"retryable: {error.get('message', '')}",
                delay_seconds=delay,
                task_id=task_id,
                run=run,
                attempts=attempts,
            )
        # not_claimed: someone holds a live lease, or the task moved on since we looked.
        task = self.store.tasks.get(task_id)
        if task.status.terminal or task.status in (TaskStatus.WAITING, TaskStatus.PAUSED, TaskStatus.IDLE):
            return Action("delete", f"task already {task.status.value}", task_id=task_id, run=run)
        if self._held_by_live_worker(task_id):
            # Its worker process is alive (the claim just asked) and holds the task's own message,
            # which a peer makes visible again if that worker dies (queueing.recovery): this copy
            # is not needed, and coming back for it would only wait out the long backstop lease.
            return Action("delete", "duplicate of a message held by a live worker", task_id=task_id, run=run)
        remaining = task.lease_expires - time.time()
        if receive_count >= self.max_receive_count:
            # A duplicate of a message a live worker holds: that worker's own message is
            # the task's lifeline, so this copy must not end up failing the task from the DLQ.
            return Action("delete", "duplicate of a message held by a live worker", task_id=task_id, run=run)
        # Come back just after the lease would lapse: if its holder died, we take over then.
        return Action(
            "retry",
            "task leased by another worker",
            delay_seconds=min(MAX_VISIBILITY, max(1, int(remaining) + 1)),
            task_id=task_id,
            run=run,
        )


def _owner_of(meta: dict[str, Any]) -> tuple[str, int] | None:
    worker, epoch = meta.get("owner_worker"), meta.get("owner_epoch")
    return None if worker is None or epoch is None else (str(worker), int(epoch))


def _was_dead_lettered(attributes: dict[str, Any] | None) -> bool:
    return bool(attributes and DEAD_LETTER_REASON in attributes)


def _dead_letter_id(attributes: dict[str, Any] | None) -> str | None:
    """The failure a redriven message was dead-lettered for, as SQS (``StringValue``) or Lambda
    (``stringValue``) hands its attributes over."""
    attr = (attributes or {}).get(DEAD_LETTER_ID) or {}
    value = attr.get("StringValue", attr.get("stringValue"))
    return str(value) if value else None
