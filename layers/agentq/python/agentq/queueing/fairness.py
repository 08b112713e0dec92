"""The dispatcher's gate for per-tenant running limits and concurrency keys.

Before a message may run its task, ``FairShare.admit`` takes the task's slots
(``storage.running_slots``: its tenant's, when the tenant has a limit, and its concurrency
key's). A task over a limit is parked on the slot's waiting list and its message deleted: it
waits ``queued`` and costs nothing until a slot frees. After a run, ``release`` gives back the
slots of a task that left ``running`` (ended, idle, waiting for its children, paused for an
approval) and sends the message of the oldest waiter each freed slot has room for, so the next
task starts as soon as a worker receives it (well within a second or two on a polling worker).

With a fleet capacity (``storage.fleet_slots``) every task also takes a fleet slot; a task the
full fleet refuses waits on its tenant's fleet list, and each fleet slot a release frees goes to
the waiting tenant with the lowest ``running / weight``: the waker admits that task itself
before sending its message (``_wake_fleet``), so the next choice counts it.

With tier limits (``storage.tier_slots``: where each tier's runners run a known number at once,
AWS's per-tier event sources) a task that runs on its tier's runners also takes its tenant's slot
of that tier, under ``fair_limit`` of the tier's capacity, so one tenant's burst in a tier leaves
that tier's reserve to the others. Refused, it parks and is woken as for its tenant's slot. A
task with a workspace that runs on the workspace pool's hosts (``TaskQueues.pool_for``) takes
none: it never holds one of the tier's invocations.

A concurrency key's ``on_conflict`` applies when the key (not the tenant) is full, on a task's
first admission (a task resuming work it started queues): ``queue`` parks, ``skip`` ends the
new task ``cancelled`` (``concurrency_skipped``; the caller reports that end as any other,
through ``queueing.endings.task_ended``), ``cancel_running`` parks the new task first in its
key's line (ahead of the tasks already waiting on the key) and then cancels the key's running
tasks, which wake it as they stop: parked before the cancel, no release can miss it. The cancel
is ``control``'s (``control.operations.cancel``), handed in as ``cancel`` (``queueing.ports``).

A key's slots are its tenant's, shared by every end user's tasks, so a task acting for an end
user cancels only that user's holders (``_cancel_holders``): a holder acting for another user, or
for none (the tenant's own), runs on, and the new task waits for its slot as it parked, first in
the key's line, until that holder stops by itself; that is ``queue`` with its place in line, the
only thing ``cancel_running`` still gives it over another user's task. A user's ``skip`` is left
as it is: it tells that user the key is full, whoever holds it. A user's token names no key of
its own (``api.user_submission``), so the key is one its agent's version carries: the tenant chose
to share it between its users, and ``skip`` on it (the agent's "busy: do not run twice") answers
whether the agent's key is full, never who holds it or which key another user's task names.

A key's freed slot is handed off: the releaser admits the waiter it wakes before sending its
message (``_hand_off``, as the fleet's waker does), so the slot is the woken task's from the
moment it frees, and no submission arriving before that message is read takes it. Without
it, a task submitted in that second ran first, and a ``cancel_running`` task, finding its key
full again, cancelled that one too.

Shared by the Lambda executor and the long-running worker (through ``Dispatcher``), so both
honour the limits the same way; a reserved-concurrency executor that meets a full tenant
deletes the message instead of retrying it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from agentq import observe
from agentq.core.errors import IllegalTransition, TaskNotFound
from agentq.core.models import Task, TaskStatus
from agentq.queueing.ports import CancelTask
from agentq.queueing.queues import TaskQueues
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.fleet_slots import FLEET, is_shard
from agentq.storage.running_slots import Admission, RunningSlots, Slot, is_key_pk

log = logging.getLogger("agentq.fairness")

ADMIT_ATTEMPTS = 3  # a park's re-check admits again; each refusal names the slot that was full


@dataclass(frozen=True)
class Gate:
    limited: bool  # the task holds (or waits for) slots: release them when it leaves running
    waits: str | None = None  # parked (its WAIT item written and still there): why its message may be deleted
    keep: str | None = None  # neither admitted nor parked: its message must come back (a retry)
    skipped: bool = False  # ended cancelled here (its key's skip): the caller reports the end


class FairShare:
    def __init__(
        self,
        store: Storage,
        queues: TaskQueues,
        *,
        default_limit: int | None = None,
        fleet_capacity: int | None = None,
        fleet_name: str = FLEET,
        cancel: CancelTask | None = None,
        tier_limits: Mapping[str, int] | None = None,
    ) -> None:
        """``cancel``: how a key's ``cancel_running`` cancels the key's holders (``control``'s
        cancel, handed in by whoever composes the gate); without it such a task cannot be
        admitted (a composition fault, raised). ``tier_limits``: a tenant's most running tasks
        of each tier whose capacity is known (``Defaults.tier_limits``; none: no tier slot)."""
        self.store = store
        self.queues = queues
        self.cancel = cancel
        self.slots: RunningSlots = store.slots.with_default(
            default_limit, fleet_capacity, fleet_name, tier_limits=tier_limits
        )

    def admit(self, task: Task, tier: str) -> Gate:
        """Whether ``task`` needs slots, and, when it may not run now, why its message may be
        deleted (it is parked), or why its message must be kept (neither). It may run when
        admitted, already holding its slots, needing none, or no longer runnable (then the
        claim refuses it)."""
        if task.slots:  # admitted already (at submission, or a takeover of a running task)
            return Gate(limited=True)
        slots = self._slots_for(task)
        if not slots:
            return Gate(limited=False)
        return self._admit(task, tier, slots)

    def _admit(self, task: Task, tier: str, slots: list[Slot]) -> Gate:
        for attempt in range(ADMIT_ATTEMPTS):
            if attempt:  # read again: the fleet shard it picked may be the one taken meanwhile
                slots = self._slots_for(task)
            full = next((s for s in slots if s.seen_full), None)  # refused by the read: no transaction
            if full is not None and (full.fleet or full.tier) and any(s.key for s in slots):
                full = None  # its key is not read: the transaction says whether the key refuses it first
            admission = Admission("refused", full) if full is not None else self.slots.admit(task, slots)
            if admission.outcome == "conflict":
                continue  # raced another write of a slot item: nothing was decided, try again
            if admission.outcome != "refused" or admission.slot is None:
                return Gate(limited=True)
            slot = admission.slot
            conflict = _on_conflict(task, slot)
            if conflict == "skip":
                return Gate(
                    limited=True, waits="skipped: its concurrency key is at its limit", skipped=self._skip(task)
                )
            first = conflict == "cancel_running"
            if first and self.cancel is None:
                raise RuntimeError("a cancel_running key needs the gate composed with a cancel (queueing.ports)")
            self.slots.park(task, slot, tier, first=first)
            if first:  # parked first, then cancelled: the holders' releases wake this task, no other
                self._cancel_holders(task)
            if slot.fleet:  # the fleet is full: waiting for it is sharing it, not a tenant held back
                log.info("task %s waits for the fleet (tenant %s)", task.task_id, task.tenant)
            else:
                limit = slot.limit if slot.limit is not None else self.slots.limit(task.tenant)  # set meanwhile
                held_by: Literal["key", "tier", "tenant"] = "key" if slot.key else "tier" if slot.tier else "tenant"
                observe.tenant_held_at_limit(task.tenant, held_by, limit or 0)
            if not self.slots.has_room(slot):
                self.pass_on(task, besides=slot)  # it may have been woken for another slot
                return Gate(limited=True, waits=self._why(slot))
            # A release between the refusal and the park woke nobody: take the slot ourselves.
            # When a waker took our item first (and sent our message), admit again all the
            # same: its room may be gone to another task by now, and running unadmitted would
            # break running <= limit; the woken message is a duplicate the claim refuses.
            self.slots.unpark(task, slot, tier, first=first)
        # Not admitted and not parked (its last re-check took its item back, or every attempt
        # conflicted): deleting its message would leave the task with neither, so it comes back.
        return Gate(limited=True, keep=f"not admitted after {ADMIT_ATTEMPTS} attempts: its message comes back")

    def _slots_for(self, task: Task) -> list[Slot]:
        """The slots ``task`` needs here: its tier's among them only when it runs on the tier's
        runners, not on the workspace pool's hosts (which hold none of the tier's invocations)."""
        if not self.slots.tier_limits:
            return self.slots.slots_for(task)
        return self.slots.slots_for(task, tiered=self.queues.pool_for(task.submission) is None)

    def _why(self, slot: Slot) -> str:
        if slot.fleet:
            return f"the fleet is full ({self.slots.fleet_capacity} running): waits queued for a slot, by weight"
        if slot.limit is None:  # admitted as unlimited, refused: an override was set meanwhile
            return "its tenant's running limit was set meanwhile: waits queued for a slot"
        return f"over its {_what(slot)} limit of {slot.limit}: waits queued for a slot"

    def release(self, task_id: str) -> list[str]:
        """Give back the slots of a task that left running; wake what they have room for. The
        slot partitions freed."""
        freed = self.slots.release(task_id)
        for pk in freed:
            self._wake(pk)
        return freed

    def pass_on(self, task: Task, *, besides: Slot | None = None) -> None:
        """Wake the next waiter of each of ``task``'s slots that has room (but ``besides``).
        A release wakes one waiter per slot it freed; a woken task that does not take that slot
        (cancelled before its message was read, or refused by another of its slots) must pass
        the wake on, or the waiters behind it wait with the slot free and, when no task of the
        tenant runs, no release to come."""
        for slot in self._slots_for(task):
            if slot.wait_pk == (besides.wait_pk if besides else None) or slot.seen_full:
                continue
            if slot.key and not self.slots.has_room(slot):
                continue
            self._wake(slot.pk)

    def _wake(self, pk: str) -> None:
        if is_shard(pk):
            self._wake_fleet()
            return
        for waiter, tier, tenant in self.slots.next_waiters(pk, if_limited=True):
            # The key's slot is the woken task's now (see the module); deleted meanwhile, the
            # slot goes to the next waiter.
            if is_key_pk(pk) and self._hand_off(waiter, tier, None) == "gone":
                self._wake(pk)
                continue
            self.queues.send(waiter, tier, tenant=tenant or None)
            log.info("task %s woken: a slot of %s has room", waiter, pk)

    def _wake_fleet(self) -> None:
        """Wake the fleet's next waiter by weight, and admit it here before sending its
        message (a hand-off), so the next wake's ``running / weight`` counts it at once.
        Counted only when its message arrives (a poll away), every release meanwhile would
        choose the same tenant: measured, 9 of 10 slots went to a weight-1 tenant against a
        weight-3 one. The hand-off is conditional on the tenant's count as the choice read it:
        releases at the same moment (a cohort of tasks ending together) read the same counts,
        and the one that finds it moved puts its waiter back in its place and chooses again."""
        for attempt in range(ADMIT_ATTEMPTS):
            picked = self.slots.next_fleet_waiters(1)
            if not picked:
                return
            task_id, tier, tenant, seen = picked[0]
            last = attempt == ADMIT_ATTEMPTS - 1
            outcome = self._hand_off(task_id, tier, None if last else seen)
            if outcome in ("moved", "gone"):
                continue  # put back in its place, or deleted meanwhile: the freed slot goes to the next choice
            self._send_handed_off(task_id, tier, tenant)
            return

    def _send_handed_off(self, task_id: str, tier: str, tenant: str) -> None:
        """Send the woken task's message. A send that fails leaves the task as the hand-off
        left it, ``queued`` and admitted (and raises, as any failed wake): its slots are never
        given back here, since a worker may already hold its message (the send raised although
        SQS took it) and gate it as admitted between a give-back and its claim, then run it on
        no slot. With no message, the sweeper re-sends it (``swept``) once it has been quiet for
        ``stale_after``, counted from the hand-off's admission; cancelled meanwhile, the cancel
        gives its slots back (``control.operations.cancel``)."""
        self.queues.send(task_id, tier, tenant=tenant or None)
        log.info("task %s woken: the fleet has room (its tenant %s is furthest below its share)", task_id, tenant)

    def _hand_off(self, task_id: str, tier: str, seen: int | None) -> str:
        """Admit the woken ``task_id`` if its tenant still runs ``seen`` tasks: "send" (admitted
        here, or left to its message to admit or park as any other), "moved" (put back on its
        list), or "gone" (deleted meanwhile: the caller chooses again, as for "moved"). A fleet shard taken between the read and the
        admission (another admission or hand-off) is read again, as ``_admit`` does."""
        try:
            task = self.store.tasks.get(task_id)
        except TaskNotFound:
            return "gone"
        if task.status is not TaskStatus.QUEUED or task.slots:
            return "send"
        tenant_pk = keys.tenant_pk(task.tenant)
        for _ in range(ADMIT_ATTEMPTS):
            slots = self._slots_for(task)
            if any(s.seen_full for s in slots):
                return "send"
            admission = self.slots.admit(task, slots, tenant_running=seen, touch=True)
            if admission.outcome == "admitted":
                return "send"
            refused_by = admission.slot
            if admission.outcome == "conflict" or (refused_by is not None and refused_by.fleet):
                continue  # raced another write, or its shard was taken meanwhile: read again
            if seen is not None and refused_by is not None and refused_by.pk == tenant_pk:
                self.slots.park(task, next(s for s in slots if s.fleet), tier)  # back in its place (same key)
                return "moved"
            return "send"
        return "send"

    def _skip(self, task: Task) -> bool:
        """End ``task`` cancelled; False when it ended otherwise meanwhile (that end is reported)."""
        error = {
            "code": "concurrency_skipped",
            "message": f"concurrency key {task.submission.concurrency.key!r} is at its limit"  # type: ignore[union-attr]
            " and on_conflict is skip",
        }
        try:
            self.store.tasks.transition(task.task_id, TaskStatus.CANCELLED, error=error)
        except IllegalTransition:  # it ended meanwhile
            return False
        return True

    def _cancel_holders(self, task: Task) -> None:
        """Cancel the tasks holding ``task``'s key (its ``cancel_running``); for a task acting
        for an end user, only that user's (see the module): the others run on, and ``task``
        waits, parked, for the slot one of them gives back when it stops."""
        concurrency = task.submission.concurrency
        assert concurrency is not None
        assert self.cancel is not None  # _admit checked, before the park
        for holder in self.slots.holders(task.tenant, concurrency.key):
            if holder == task.task_id:
                continue
            try:
                if task.user is not None and self.store.tasks.get(holder).user != task.user:
                    log.info("task %s of user %s leaves task %s of another user (or of none) holding key %r",
                             task.task_id, task.user, holder, concurrency.key)  # fmt: skip
                    continue
                self.cancel(self.store, holder, tenant=task.tenant, queues=self.queues, slots=self.slots,
                       reason=f"cancelled by task {task.task_id} (concurrency key {concurrency.key!r})")  # fmt: skip
            except IllegalTransition:
                continue  # it ended meanwhile
            except TaskNotFound:  # purged (TTL) while its HOLD item stayed: nothing to cancel
                log.warning("task %s holds key %r but no longer exists", holder, concurrency.key)


def _on_conflict(task: Task, slot: Slot) -> str:
    """What a refusal by ``slot`` does. A key's ``skip`` and ``cancel_running`` apply to a
    task's first admission only: a task that already ran (``claim_count`` > 0: a parent woken
    by its children, a resumed approval, a reopened conversation, a redrive) is resuming work
    it started, and queues like any other."""
    concurrency = task.submission.concurrency
    if not slot.key or concurrency is None or task.claim_count > 0:
        return "queue"
    return concurrency.on_conflict


def _what(slot: Slot) -> str:
    return "concurrency key's" if slot.key else "tier's running (per tenant)" if slot.tier else "tenant's running"
