"""The dispatcher's gate for per-tenant running limits and concurrency keys.

Before a message may run its task, ``FairShare.admit`` takes the task's slots
(``storage.running_slots``: its tenant's, when the tenant has a limit, and its concurrency
key's). A task over a limit is parked on the slot's waiting list and its message deleted: it
waits ``queued`` and costs nothing until a slot frees. After a run, ``release`` gives back the
slots of a task that left ``running`` (ended, idle, waiting for its children, paused for an
approval) and sends the message of the oldest waiter each freed slot has room for, so the next
task starts as soon as a worker receives it (well within a second or two on a polling worker).

A concurrency key's ``on_conflict`` applies when the key (not the tenant) is full: ``queue``
parks, ``skip`` ends the new task ``cancelled`` (``concurrency_skipped``), ``cancel_running``
cancels the key's running tasks and parks the new one, which they wake as they stop.

Shared by the Lambda executor and the long-running worker (through ``Dispatcher``), so both
honour the limits the same way; a reserved-concurrency executor that meets a full tenant
deletes the message instead of retrying it.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from agentq import observe
from agentq.control.operations import cancel
from agentq.core.errors import IllegalTransition
from agentq.core.models import Task, TaskStatus
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage
from agentq.storage.running_slots import Admission, RunningSlots, Slot

log = logging.getLogger("agentq.fairness")

ADMIT_ATTEMPTS = 3  # a park's re-check admits again; each refusal names the slot that was full


@dataclass(frozen=True)
class Gate:
    limited: bool  # the task holds (or waits for) slots: release them when it leaves running
    waits: str | None = None  # parked (its WAIT item written and still there): why its message may be deleted
    keep: str | None = None  # neither admitted nor parked: its message must come back (a retry)


class FairShare:
    def __init__(self, store: Storage, queues: TaskQueues, *, default_limit: int | None = None) -> None:
        self.store = store
        self.queues = queues
        self.slots: RunningSlots = store.slots.with_default(default_limit)

    def admit(self, task: Task, tier: str) -> Gate:
        """Whether ``task`` needs slots, and, when it may not run now, why its message may be
        deleted (it is parked), or why its message must be kept (neither). It may run when
        admitted, already holding its slots, needing none, or no longer runnable (then the
        claim refuses it)."""
        if task.slots:  # admitted already (at submission, or a takeover of a running task)
            return Gate(limited=True)
        slots = self.slots.slots_for(task)
        if not slots:
            return Gate(limited=False)
        return self._admit(task, tier, slots)

    def _admit(self, task: Task, tier: str, slots: list[Slot]) -> Gate:
        full = next((s for s in slots if s.seen_full), None)  # refused by the read: no transaction
        for _ in range(ADMIT_ATTEMPTS):
            admission = Admission("refused", full) if full is not None else self.slots.admit(task, slots)
            full = None
            if admission.outcome == "conflict":
                continue  # raced another write of a slot item: nothing was decided, try again
            if admission.outcome != "refused" or admission.slot is None:
                return Gate(limited=True)
            slot = admission.slot
            conflict = task.submission.concurrency.on_conflict if slot.key and task.submission.concurrency else "queue"
            if conflict == "skip":
                return Gate(limited=True, waits=self._skip(task))
            if conflict == "cancel_running":
                self._cancel_holders(task)
            self.slots.park(task, slot, tier)
            observe.tenant_held_at_limit(task.tenant, "key" if slot.key else "tenant", slot.limit)
            if not self.slots.has_room(slot):
                return Gate(
                    limited=True, waits=f"over its {_what(slot)} limit of {slot.limit}: waits queued for a slot"
                )
            # A release between the refusal and the park woke nobody: take the slot ourselves.
            # When a waker took our item first (and sent our message), admit again all the
            # same: its room may be gone to another task by now, and running unadmitted would
            # break running <= limit; the woken message is a duplicate the claim refuses.
            self.slots.unpark(task, slot, tier)
        # Not admitted and not parked (its last re-check took its item back, or every attempt
        # conflicted): deleting its message would leave the task with neither, so it comes back.
        return Gate(limited=True, keep=f"not admitted after {ADMIT_ATTEMPTS} attempts: its message comes back")

    def release(self, task_id: str) -> None:
        """Give back the slots of a task that left running; wake what they have room for."""
        for pk in self.slots.release(task_id):
            for waiter, tier, tenant in self.slots.next_waiters(pk):
                self.queues.send(waiter, tier, tenant=tenant or None)
                log.info("task %s woken: a slot of %s freed", waiter, pk)

    def _skip(self, task: Task) -> str:
        error = {
            "code": "concurrency_skipped",
            "message": f"concurrency key {task.submission.concurrency.key!r} is at its limit"  # type: ignore[union-attr]
            " and on_conflict is skip",
        }
        with contextlib.suppress(IllegalTransition):  # it ended meanwhile
            self.store.tasks.transition(task.task_id, TaskStatus.CANCELLED, error=error)
        return "skipped: its concurrency key is at its limit"

    def _cancel_holders(self, task: Task) -> None:
        concurrency = task.submission.concurrency
        assert concurrency is not None
        for holder in self.slots.holders(task.tenant, concurrency.key):
            if holder == task.task_id:
                continue
            try:
                cancel(self.store, holder, tenant=task.tenant, queues=self.queues,
                       reason=f"cancelled by task {task.task_id} (concurrency key {concurrency.key!r})")  # fmt: skip
            except IllegalTransition:
                continue  # it ended meanwhile


def _what(slot: Slot) -> str:
    return "concurrency key's" if slot.key else "tenant's running"
