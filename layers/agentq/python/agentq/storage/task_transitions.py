"""A task's status transitions, and the failure and retry records a worker or the queue keeps
on the way.

Status changes are conditional on the current status being one that may lead to the new one
(``sources_of``), so an illegal transition is refused by DynamoDB, not by a read-then-write
race. Entering a terminal status stamps META's ``expires_at`` (the retention, ``TaskItems``) in
the same write; leaving one is refused once that retention has run out.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import Attr

from agentq import observe
from agentq.core.errors import ConversationMoved, IllegalTransition, LeaseLost, TaskNotFound
from agentq.core.models import (
    ALLOWED_TRANSITIONS,
    REOPENED_BY_MESSAGE,
    Lease,
    RetryState,
    TaskStatus,
    TaskSubmission,
    sources_of,
)
from agentq.core.status import DEFERRED_EPOCH, LOOK_DUE, SILENT_UNTIL
from agentq.observe.redaction import redact
from agentq.resources import LIVE_ATTRIBUTES, TTL_ATTRIBUTE
from agentq.storage import keys
from agentq.storage.event_writes import TOGETHER, LoggedWrite, NewEvent, logged_together, logged_transact
from agentq.storage.leases import why_fenced
from agentq.storage.messages import nothing_waits
from agentq.storage.table import (
    STOPPING,
    Check,
    ConditionFailed,
    Item,
    Patch,
    Put,
    TransactionCancelled,
    TransactionConflict,
    Update,
    fence,
    present,
    status_in,
    transact_leaving_out,
)
from agentq.storage.task_items import (
    TaskItems,
    first_end_writes,
    live_keys,
    merged,
    read_submission,
    reopening,
    same_submission,
)

REPLACE_ATTEMPTS = 20  # writers racing on one submission (raises, a move): each loss means another won
REPLACE_BACKOFF_SECONDS = 0.02


def recorded(error: dict[str, Any]) -> dict[str, Any]:
    """``error`` as META keeps it, each text in it redacted: a failure's message may quote what
    an outside party said after the egress proxy added a credential to a request (git's stderr
    from a clone, a server's answer), and a task's error is served by the API, the console and
    callbacks, where a credential must never appear."""
    return {k: redact(v) if isinstance(v, str) else v for k, v in error.items()}


class TaskTransitions(TaskItems):
    def transition(
        self,
        task_id: str,
        to: TaskStatus,
        *,
        lease: Lease | None = None,
        result: str | None = None,
        error: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        reopen: bool = False,
        expect: dict[str, str] | None = None,
        read: dict[str, Any] | None = None,
        delivered: int | None = None,
    ) -> str:
        """Move a task to ``to``; DynamoDB refuses it unless the current status may lead there.
        Returns the status it moved from (a stop reports the tasks it found running).

        With a lease the write is also fenced by its epoch. ``extra``: attributes set in the
        same write (a waiting task's ``batch``, a failure's ``dead_letter``). ``reopen``: the task
        has ended (failed, out of budget) and goes on (a redrive, a raised budget): only from an
        ended status, and the write starts its next invocation (``task_items.reopening``).
        ``expect``: attributes META must hold for the move (a redrive: the failure it was
        dead-lettered for); refused (``IllegalTransition``) otherwise. ``read``: META as the
        caller read it (``read_many``), written from instead of a read of its own
        (``event_writes.logged_transact``); the status returned is still the one the write replaced.
        ``delivered``: the move ends the turn of a conversation that holds that many of its
        messages (a fork ending on its copied answer, ``core.engine._loop``): refused while a
        later one waits, as a step commit that ends the task is (``steps._heeds_messages``,
        ARCHITECTURE 11), with ``ConversationMoved`` naming how many came in, so the engine
        delivers it instead of ending over it.
        """
        now = time.time()
        allowed, patch, event = self._move(task_id, to, now, lease=lease, result=result, error=error, extra=extra,
                                           reopen=reopen, expect=expect, delivered=delivered)  # fmt: skip
        leaves_terminal = any(src.terminal for src in allowed)
        first_end: list[Put] = []
        if reopen:  # the end it leaves is kept, from META as read (the write is pinned to that read)
            read = read if read is not None else self.table.get(keys.meta_key(task_id))
            if read is not None:
                kept, first_end = first_end_writes(task_id, read)
                patch = Patch(patch.name, patch.key, merged(patch.update, kept), patch.condition)
        try:
            meta = logged_transact(
                self.table,
                task_id,
                [patch, *first_end],
                NewEvent("task.status", event),
                read=read,
            )
        except TransactionCancelled as exc:
            current = self.get(task_id)  # raises TaskNotFound if absent
            if lease is not None and current.lease_epoch != lease.epoch:
                raise LeaseLost(f"lease epoch {lease.epoch} of task {task_id} is no longer current") from exc
            if lease is not None and current.status in allowed:
                stopping = why_fenced(self.table, lease)
                if "stopping" in stopping.details:  # a stop's mark
                    raise stopping from exc
                if delivered is not None and current.messages_received != delivered:
                    raise ConversationMoved(
                        f"task {task_id}: a message came in", received=current.messages_received, interrupt_at=None
                    ) from exc
            if leaves_terminal and current.status.terminal and (current.expires_at or float("inf")) <= now:
                raise IllegalTransition(
                    f"task {task_id} is {current.status.value} and its retention ran out; it is being deleted",
                    field="task_id",
                ) from exc
            if expect and current.status in allowed:
                raise IllegalTransition(
                    f"task {task_id} is {current.status.value}, but no longer as it was expected to be", field="status"
                ) from exc
            raise IllegalTransition(
                f"task {task_id} cannot move from {current.status.value!r} to {to.value!r}", field="status"
            ) from exc
        observe.task_status_changed(
            task_id, str((meta or {}).get("tenant", "")), to.value, **({"error": error.get("code")} if error else {})
        )
        return str((meta or {}).get("status", ""))

    def move_together(
        self, reads: list[Item], to: TaskStatus, *, error: dict[str, Any] | None = None
    ) -> list[str | None]:
        """Move up to ``events.TOGETHER`` tasks to ``to`` in one transaction (a stop's fences),
        each written from META as the caller read it (``read_many``), its status, ``seq`` and
        ``step`` still those read; returns each one's status before, None for one left out (it
        moved since the read, or may not make this move; the caller moves it with
        ``transition``, which reads it again)."""
        now = time.time()
        writes = []
        for read in reads:
            task_id = str(read["task_id"])
            _, patch, event = self._move(task_id, to, now, error=error)
            writes.append(LoggedWrite(task_id, patch, NewEvent("task.status", event), read))
        moved = logged_together(self.table, writes)
        for write, done in zip(writes, moved, strict=True):
            if done:
                tenant = str(write.read.get("tenant", ""))
                observe.task_status_changed(
                    write.task_id, tenant, to.value, **({"error": error.get("code")} if error else {})
                )
        return [str(w.read["status"]) if done else None for w, done in zip(writes, moved, strict=True)]

    def mark_stopping(self, task_ids: list[str], scope: str) -> list[bool]:
        """A stop's mark (``STOPPING`` = ``scope``) on up to ``events.TOGETHER`` tasks in one
        transaction, before their move to ``cancelled``: from it on the fence (``table.fence``)
        refuses every write of their workers, step commits included, so nothing moves their
        ``seq`` or ``step`` and the move, which pins them, is not refused by a step committed
        between its read and its write. The mark pins nothing itself: only a task that ended (or
        was purged) since it was listed refuses it, and is left out. Which were marked, in order;
        none on a conflict with another transaction (the move then fences them as it would)."""
        if len(task_ids) > TOGETHER:
            raise ValueError(f"at most {TOGETHER} tasks a transaction")
        condition = present() & status_in(sources_of(TaskStatus.CANCELLED))
        return transact_leaving_out(
            self.table,
            len(task_ids),
            lambda i: [Patch(f"meta{i}", keys.meta_key(task_ids[i]), Update(set={STOPPING: scope}), condition)],
        )

    def _move(
        self,
        task_id: str,
        to: TaskStatus,
        now: float,
        *,
        lease: Lease | None = None,
        result: str | None = None,
        error: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        reopen: bool = False,
        expect: dict[str, str] | None = None,
        delivered: int | None = None,
    ) -> tuple[list[TaskStatus], Patch, dict[str, Any]]:
        """The statuses a move to ``to`` may start from, its conditional write of META, and the
        data of the ``task.status`` event it logs (``transition``)."""
        # Only a person's message reopens a conversation (``storage.messages``), in a write that
        # also delivers the message: never a generic requeue (a stale wake, a redrive).
        allowed = [src for src in sources_of(to) if not (to is TaskStatus.QUEUED and src in REOPENED_BY_MESSAGE)]
        if reopen:
            allowed = [src for src in allowed if src.terminal] if to is TaskStatus.QUEUED else []
        if not allowed:
            raise IllegalTransition(f"no status may move to {to.value!r}", field="status")
        sets: dict[str, Any] = {"status": to.value, "updated_at": now}
        # A stop's mark goes with any move: the task is then fenced by its status (cancelled),
        # or was moved by a path after which a claim reads the stops again (a requeue).
        removes: list[str] = [STOPPING]
        if to is not TaskStatus.RUNNING:  # only a running task holds a lease
            sets["lease_expires"] = 0
        if to is TaskStatus.QUEUED:  # a requeue starts clean
            # ... out of the failure it was dead-lettered for too: a copy of the redriven message
            # (``dispatch._ended``, expect=dead_letter) must not requeue a later failure of its
            # that never reached the DLQ, and so wrote no dead_letter of its own.
            removes += ["error", "finished_at", "dead_letter"]
        if to.terminal:
            sets.update({"finished_at": now, TTL_ATTRIBUTE: self.expiry(now)})
            removes += LIVE_ATTRIBUTES  # out of the sweeper's index
        elif to is TaskStatus.IDLE:  # an interrupted conversation expires after the same retention
            sets[TTL_ATTRIBUTE] = self.expiry(now)
        else:
            sets.update(live_keys(task_id))  # back in it (a requeue from the DLQ)
            removes.append(TTL_ATTRIBUTE)  # a live task never expires (a no-op unless leaving a terminal status)
        if result is not None:
            sets.update(self._result_attrs(task_id, result, lease))
        if error is not None:
            sets["error"] = recorded(error)
            removes = [r for r in removes if r != "error"]
        sets.update(extra or {})
        if LOOK_DUE not in sets:  # only the park that schedules a look says when it is due
            removes.append(LOOK_DUE)
        condition = present() & status_in(allowed)
        leaves_terminal = any(src.terminal for src in allowed)
        if leaves_terminal:
            # Not once the retention has run out: from then on DynamoDB TTL may delete META (and
            # the reaper the rest of the task) at any moment. Only terminal tasks carry expires_at.
            condition = condition & (Attr(TTL_ATTRIBUTE).not_exists() | Attr(TTL_ATTRIBUTE).gt(Decimal(repr(now))))
        if lease is not None:  # a worker's move: its epoch, and no stop has marked the task
            condition = condition & Attr("lease_epoch").eq(lease.epoch) & Attr(STOPPING).not_exists()
        for name, value in (expect or {}).items():
            condition = condition & Attr(name).eq(value)
        if delivered is not None:
            condition = condition & nothing_waits(delivered)
        event = {"status": to.value, **({"error": error.get("code")} if error else {})}
        update = Update(set=sets, remove=removes)
        if reopen:
            update = merged(update, reopening(now))
        return allowed, Patch("meta", keys.meta_key(task_id), update, condition), event

    def _result_attrs(self, task_id: str, result: str, lease: Lease | None) -> dict[str, Any]:
        """``result`` inline, or an S3 pointer (``result_ref``) when it is large."""
        epoch = lease.epoch if lease else 0
        attrs = self.payloads.encode(f"{keys.payload_prefix(task_id)}result-e{epoch}.txt", result)
        return {"result": attrs["body"]} if "body" in attrs else {"result_ref": attrs["ref"]}

    def finish_update(
        self,
        task_id: str,
        lease: Lease,
        finish: TaskStatus,
        now: float,
        result: str | None,
        error: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The META attributes a step commit sets when it ends the task."""
        assert finish in ALLOWED_TRANSITIONS[TaskStatus.RUNNING] and finish.terminal
        sets: dict[str, Any] = {
            "status": finish.value,
            "finished_at": now,
            "lease_expires": 0,
            TTL_ATTRIBUTE: self.expiry(now),
        }
        if result is not None:
            sets.update(self._result_attrs(task_id, result, lease))
        if error is not None:
            sets["error"] = recorded(error)
        return sets

    def pause(self, lease: Lease) -> Patch:
        """The fenced write that pauses a running task (it gives up its lease)."""
        return Patch(
            "meta",
            keys.meta_key(lease.task_id),
            Update(set={"status": TaskStatus.PAUSED.value, "lease_expires": 0, "updated_at": time.time()}),
            fence(lease),
        )

    def replace_submission(
        self, task_id: str, change: Callable[[TaskSubmission], TaskSubmission], *, when_status: TaskStatus
    ) -> TaskSubmission:
        """Replace the task's submission with ``change`` of it while the task is ``when_status``
        (else ``IllegalTransition``): made of the submission as read here, and put only while it is
        still that one (``same_submission``), so a write between the two (a message's raise, a
        move) is never undone: it is read again, and ``change`` made of it. The submission put."""
        for _ in range(REPLACE_ATTEMPTS):
            current, read = read_submission(self.table, task_id)
            submission = change(current)
            status = Attr("status").eq(when_status.value)
            meta = Patch("meta", keys.meta_key(task_id), Update(set={"updated_at": time.time()}), status)
            put = Put("submission", self.submission_item(task_id, submission), same_submission(read))
            try:
                self.table.transact([meta, put])
            except TransactionCancelled as exc:
                if "meta" in exc.failed:
                    raise IllegalTransition(
                        f"task {task_id} is no longer {when_status.value}", field="task_id"
                    ) from exc
            except TransactionConflict:
                pass
            else:
                return submission
            time.sleep(random.uniform(0, REPLACE_BACKOFF_SECONDS))  # replaced since it was read: read it again
        raise IllegalTransition(f"task {task_id}'s submission kept changing while it was written; try again",
                                field="task_id")  # fmt: skip

    def next_look(self, task_id: str, due: float, *, after: float | None) -> bool:
        """Move a waiting task's next look's due time (``LOOK_DUE``) from ``after`` (the due the
        caller read; None: it had none) to ``due``; written before that look is queued
        (``queueing.dispatch._batch_poll``, ``queueing.sweeper``), so a look lost between the two
        is found by the sweeper and a stray one is told from it. A compare-and-set: of two looks
        that read the same due (a redelivered copy, the sweeper's beside the late one) only one
        moves it, and the other queues nothing, so looks never go on as two chains; a look that
        read the due of an earlier park never moves a later park's. False, and nothing written,
        when the task is no longer waiting or its due is no longer ``after``."""
        read = Attr(LOOK_DUE).not_exists() if after is None else Attr(LOOK_DUE).eq(after)
        try:
            self.table.update(keys.meta_key(task_id), Update(set={LOOK_DUE: due}),
                              condition=present() & status_in([TaskStatus.WAITING]) & read)  # fmt: skip
        except ConditionFailed:
            return False
        return True

    def note_traced(self, task_id: str, invocation: int) -> None:
        """The ``invoke_agent`` span of the task's ``invocation`` was sent and flushed
        (``Task.traced_invocation``): a redelivery of its end sends it no more. Unfenced (the
        task has ended; a reopen since starts a later invocation, which this does not name); a
        task deleted meanwhile is nothing to note."""
        with contextlib.suppress(ConditionFailed):
            self.table.update(keys.meta_key(task_id), Update(set={"traced_invocation": invocation}),
                              condition=present())  # fmt: skip

    def set_task_token(self, task_id: str, token: str) -> None:
        self.table.update(keys.meta_key(task_id), Update(set={"task_token": token}), condition=present())

    def record_failure(self, task_id: str, step: int) -> int:
        """Count one retryable failure of the task at ``step``; returns the failures in a row there.

        The count is the task's own (on META), so it grows only when the task itself fails, not
        when a message is received again because a worker was killed or stopped; a step
        committed since the last failure starts the count again.
        """
        key = keys.meta_key(task_id)
        try:
            item = self.table.update(
                key,
                Update(add={"failures": 1}, set={"updated_at": time.time()}),
                condition=present() & Attr("failure_step").eq(step),
                returns="ALL_NEW",
            )
            assert item is not None
            return int(item["failures"])
        except ConditionFailed:
            try:
                self.table.update(
                    key,
                    Update(set={"failures": 1, "failure_step": step, "updated_at": time.time()}),
                    condition=present(),
                )
            except ConditionFailed as exc:
                raise TaskNotFound(f"no task {task_id!r}", field="task_id") from exc
            return 1

    def record_retry(
        self,
        task_id: str,
        state: RetryState,
        *,
        lease: Lease | None = None,
        silent_until: float | None = None,
        deferred_epoch: int | None = None,
    ) -> bool:
        """Replace the task's ``META#RETRY`` with ``state``, so status and the trace show the
        retry while it waits. With a lease the write is fenced (the worker retrying a call);
        without one (the queue's redelivery) it is made only while the task is queued or
        running. ``silent_until`` and ``deferred_epoch`` go on META with it (``core.status``:
        when the message that brings it back is due, the claim whose run deferred). Returns
        False when the task had ended."""
        state = state.model_copy(update={"message": redact(state.message)[:500]})
        item = {**keys.retry_key(task_id), **state.model_dump()}
        guard = fence(lease) if lease is not None else present() & status_in([TaskStatus.QUEUED, TaskStatus.RUNNING])
        event = NewEvent("task.retry", state.model_dump(mode="json"))
        sets: dict[str, Any] = {}
        if silent_until is not None:
            sets[SILENT_UNTIL] = silent_until
        if deferred_epoch is not None:
            sets[DEFERRED_EPOCH] = deferred_epoch
        meta: Check | Patch = (
            Patch("task", keys.meta_key(task_id), Update(set=sets), guard)
            if sets
            else Check("task", keys.meta_key(task_id), guard)
        )
        try:
            logged_transact(self.table, task_id, [meta, Put("retry", item)], event, meta="task")
        except TransactionCancelled as exc:
            if lease is not None:
                raise why_fenced(self.table, lease) from exc
            return False
        return True
