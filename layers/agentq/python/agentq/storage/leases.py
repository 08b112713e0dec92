"""A task's lease: claim, extend, release, the claim history, and the fence every worker write carries.

A claim is one conditional UpdateItem of META: it succeeds only while no live lease exists, and
bumps ``lease_epoch``. Every write a worker makes carries the lease fence (``table.fence``): a
worker whose lease was taken over (a zombie woken from SIGSTOP) can write nothing. ``why_fenced``
tells which part of the fence refused a write, for every repository that writes fenced (tasks,
steps, budgets, spawns, approvals, effects, notes), so it depends on none of them.

A claim made by a long-running worker names its owner (``ClaimOwner``: the worker process, its
liveness epoch, the task's queue message) on META: ``owner_worker``, ``owner_epoch``,
``owner_message``, ``owner_queue``, and ``owner_task`` (the sparse ``owner`` index's sort key,
so the tasks of a dead worker are one Query). Such a task's own lease is long (a backstop): the
worker's liveness item (``storage.workers``) keeps it alive, one write per worker per
heartbeat. A claim may take a task whose lease has not lapsed when its owner's liveness has;
the fence is the same ``lease_epoch`` either way.
"""

from __future__ import annotations

import contextlib
import logging
import time
from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq import observe
from agentq.core.errors import LeaseLost, TaskNotFound
from agentq.core.models import Lease, LostClaim, Task, TaskStatus
from agentq.core.records import ClaimOwner, ClaimRecord
from agentq.core.reservation import Seen
from agentq.core.status import DEFERRED_EPOCH, SILENT_UNTIL
from agentq.core.workspace import WorkspaceRef, WorkspaceStartRefused
from agentq.resources import GSI_OWNER
from agentq.storage import keys
from agentq.storage.table import (
    STOPPING,
    ConditionFailed,
    Item,
    Table,
    Update,
    absent,
    fence,
    fence_holds,
    plain,
    present,
    status_in,
)
from agentq.storage.task_items import TaskItems
from agentq.storage.workers import WorkerLiveness

log = logging.getLogger("agentq.storage")


def _unsettled(batch_id: str) -> ConditionBase:
    """No one took the settling of batch ``batch_id``'s windows' hold yet."""
    return Attr("batch_settled").not_exists() | Attr("batch_settled").ne(batch_id)


def why_fenced(table: Table, lease: Lease) -> LeaseLost:
    """Explain a write the fence refused: the epoch moved on, the task stopped, or the step moved."""
    return refused(lease, _read_meta(table, lease.task_id))


def refused(lease: Lease, current: Item | None) -> LeaseLost:
    """Which part of the fence ``current`` (META as read, or as a refused write found it) fails,
    in the order a worker must act on: gone, taken over, ended, being stopped; else the step moved."""
    if current is None:  # purged: the writer takes back what it wrote outside the fence (``Steps``)
        gone = LeaseLost(f"task {lease.task_id} no longer exists")
        gone.details["gone"] = True
        return gone
    epoch, status, step = int(current["lease_epoch"]), TaskStatus(current["status"]), int(current["step"])
    if epoch != lease.epoch:
        return LeaseLost(f"lease epoch {lease.epoch} of task {lease.task_id} superseded by {epoch}")
    if status is not TaskStatus.RUNNING:
        err = LeaseLost(f"task {lease.task_id} is {status.value}; the worker must stop")
        err.details["status"] = status
        return err
    if STOPPING in current:
        return _being_stopped(lease, current)
    return LeaseLost(f"task {lease.task_id} step moved to {step} under epoch {lease.epoch}")


def _being_stopped(lease: Lease, meta: Item) -> LeaseLost:
    """A stop's mark refused the write (``table.STOPPING``): the worker lets the task go
    (``details["stopping"]``: the stop's scope). Not reported as ended: the task is still
    ``running`` until the stop's move to ``cancelled`` lands (a stop killed before it leaves the
    task to the next delivery, which cancels it, or runs it on if the scope was resumed)."""
    err = LeaseLost(f"task {lease.task_id} is being stopped ({meta[STOPPING]}); the worker lets it go")
    err.details["stopping"] = str(meta[STOPPING])
    return err


def _read_meta(table: Table, task_id: str) -> Item | None:
    return table.get(keys.meta_key(task_id))


# The claim a claim supersedes ("pc": previous claim, its epoch one less; w: its worker, at: when,
# n and s: the step and seq it found, f: the status it took the task from), as META held it,
# copied by the claim's own write: what the superseded claim's event and record are made from
# when its claimer died before writing its record (see ``Leases.claim``). New attribute <- the
# one it is copied from, or the value when absent: ``pc_n`` < 0 says there is no such claim in
# the log (the first claim, or one made before claims had positions). Short names, and gone
# again at the claimer's first step commit (``storage.steps``), when its records are written:
# every write of META is billed per started KB of it.
PREVIOUS_CLAIM = {
    "pc_w": ("lease_owner", ""),
    "pc_at": ("last_claimed_at", 0),
    "pc_n": ("claim_step", -1),
    "pc_s": ("claim_seq", 0),
    "pc_f": ("claimed_from", ""),
}
# META's previous claim may have no record yet: there is one (``pc_n`` >= 0), and the latest claim
# found the step it found (its claimer committed none before the latest claim: nothing says it
# wrote its record), and the latest claimer has committed no step since (which would have removed
# the copy, its records written). The claim write that would take such a claim out of META is
# refused, and made again once that record is written (``TaskLeases._claim_write``).
UNRECORDED_PREVIOUS = Attr("pc_n").gte(0) & Attr("pc_n").eq(Attr("claim_step"))


def _claim_record(task_id: str, epoch: int, worker: Any, at: Any, step: Any, seq: Any, claimed_from: Any) -> Item:
    """The ``CLAIM#epoch`` item of a claim: who, when, and its place in the task's event log."""
    return {**keys.item_key(task_id, keys.claim_sk(epoch)), "epoch": epoch, "worker": worker, "at": at,
            "step": step, "seq": seq, "claimed_from": claimed_from}  # fmt: skip


LIVE_TEXT_CHARS = 1000  # of a call in flight: enough to watch, small enough for one write unit
OWNER_ATTRIBUTES = ("owner_worker", "owner_epoch", "owner_message", "owner_queue", "owner_task")
CLAIMABLE = (TaskStatus.QUEUED, TaskStatus.RUNNING)


def _after_deferral(meta: Item, epoch: int) -> bool:
    """Did the run of the claim before this one (``epoch``'s) end in a deferral?"""
    deferred = meta.get(DEFERRED_EPOCH)
    return deferred is not None and int(deferred) == epoch - 1


def _lost_claim(old: Item) -> LostClaim | None:
    """The claim META held (``old``, as a refused claim write found it) when its worker never
    gave the lease back: the task ``running``, its lease still set (a release, an end, a park
    set it to 0). Killed or stalled, that worker sent no ``run`` span (``Task.lost_claim``)."""
    if old.get("status") != TaskStatus.RUNNING.value or not float(old.get("lease_expires", 0)):
        return None
    beat = old.get("heartbeat_at")
    claimed = old.get("last_claimed_at", beat)
    return LostClaim(epoch=int(old.get("lease_epoch", 0)), worker=str(old.get("lease_owner", "")),
                     claimed_at=float(claimed or 0), heartbeat_at=float(beat) if beat is not None else None)  # fmt: skip


def _live(live_text: str | None, seen: Seen | None) -> dict[str, Any]:
    """The META attributes of a streamed call in flight, those there are."""
    sets: dict[str, Any] = {}
    if live_text:
        sets["live_text"] = live_text[-LIVE_TEXT_CHARS:]
    if seen is not None:
        sets["seen"] = seen.to_item()
    return sets


class TaskLeases(TaskItems):
    def claim(
        self, task_id: str, worker: str, lease_seconds: float, *, owner: ClaimOwner | None = None
    ) -> tuple[Lease, Task] | None:
        """Take the task if it is claimable and no live lease exists; bumps the epoch.

        Returns None when another worker holds a live lease (or its owner is alive) or the task
        is not runnable (finished, paused, waiting). A conditional UpdateItem of META
        (``_claim_write``), then the records of the claim it superseded and of its own
        (``CLAIM#epoch``), and a read of the submission. ``owner``: see the module.

        Why the superseded claim's record too: a claim is in the task's event log from its META
        write on (the latest claim is read from META, ``storage/events.py``), and an events
        stream may send it at once; a claimer killed before its record was written left a claim
        that the next claim's write took out of META, so a watcher had received an event the log
        no longer held. Each claim copies the claim it supersedes into META (``PREVIOUS_CLAIM``,
        in the same write), from which the log reads it until its record exists, and writes that
        record first (the content its claimer would have written, less the heartbeat it found)
        unless the task's step moved since that claim (only its claimer's commits move it, and
        they come after its records), then its own. And a claim never takes a claim out of META
        whose record may not exist: ``_claim_write`` writes it first. So a claim is in the log
        for good from its META write on, however many claimers in a row die before their records
        (two in a row lost the first one's event: a watcher on the hub had been sent it).
        """
        now = time.time()
        sets: dict[str, Any] = {
            "lease_owner": worker,
            "lease_expires": now + lease_seconds,
            "status": TaskStatus.RUNNING.value,
            "updated_at": now,
            "heartbeat_at": now,
            "last_claimed_at": now,
        }
        if owner is not None:
            sets.update(owner_worker=owner.worker, owner_epoch=owner.epoch, owner_task=task_id)
            sets.update({k: v for k, v in (("owner_message", owner.message), ("owner_queue", owner.queue)) if v})
            remove = [a for a in ("owner_message", "owner_queue") if a not in sets]
        else:
            remove = list(OWNER_ATTRIBUTES)  # a per-task lease: no worker's liveness covers it
        update = Update(
            set=sets,
            add={"lease_epoch": 1, "claim_count": 1},
            set_if_absent={"started_at": now, "first_claimed_at": now},
            # a lapsed lease's call in flight: never shown as this one's; a stop's mark left by a
            # stop that died before its move to cancelled: this claim read the stops after it
            # (``queueing.dispatch``), so the scope is not stopped, or a stop is still under way
            # and will move the task to cancelled (its move pins nothing a claim changes but status);
            # the silence a deferral or a retry's delay kept (the sweeper's): this claim ends it,
            # and the run's own writes say it lives from here on
            remove=[*remove, "live_text", STOPPING, SILENT_UNTIL],
            # where the claim falls in the task's event log (storage/events.py), and whether it
            # took a running task over: the values as they were before this write
            copy_from={
                "prev_heartbeat_at": ("heartbeat_at", now),
                "claim_step": ("step", 0),
                "claim_seq": ("seq", 0),
                "claimed_from": ("status", TaskStatus.QUEUED.value),
                **PREVIOUS_CLAIM,
            },
        )
        written = self._claim_write(task_id, update, now)
        if written is None:
            return None
        meta, lost = written
        epoch = int(meta["lease_epoch"])
        if meta.get("claimed_from") == TaskStatus.RUNNING.value:
            if _after_deferral(meta, epoch):
                meta = self._take_deferred(task_id, epoch, meta)
            else:
                meta = self._count_resume(task_id, epoch, meta)
        self._record_previous(task_id, meta)  # the claim it superseded, unless its claimer committed a step since
        claim = _claim_record(task_id, epoch, worker, now, meta["claim_step"], meta["claim_seq"], meta["claimed_from"])
        self.table.put({**claim, "prev_heartbeat_at": meta["prev_heartbeat_at"]})
        sub = self.table.get(keys.submission_key(task_id))
        if sub is None:
            raise TaskNotFound(f"task {task_id!r} has no submission", field="task_id")
        task = self._decode(meta, sub)
        if lost is not None and meta.get("claimed_from") == TaskStatus.RUNNING.value:  # not after a deferral
            task = task.model_copy(update={"lost_claim": lost})
        observe.task_status_changed(task_id, task.tenant, TaskStatus.RUNNING.value, epoch=epoch, worker=worker)
        return Lease(task_id=task_id, owner=worker, epoch=epoch, expires_at=task.lease_expires), task

    def _take_deferred(self, task_id: str, epoch: int, meta: Item) -> Item:
        """This claim took a task whose last run deferred it (``core.status.DEFERRED_EPOCH``:
        it gave its lease back and waited for its delayed message), so it took over no run in
        progress: it counts no resume, and is recorded as a claim of a queued task (the trace
        shows no takeover). Its own write after the claim's, as ``_count_resume`` is."""
        try:
            taken = self.table.update(
                keys.meta_key(task_id),
                Update(set={"claimed_from": TaskStatus.QUEUED.value}),
                condition=Attr("lease_epoch").eq(epoch),
                returns="ALL_NEW",
            )
        except ConditionFailed:  # taken over again meanwhile
            return meta
        return taken if taken is not None else meta

    def _count_resume(self, task_id: str, epoch: int, meta: Item) -> Item:
        """This claim took over a run that had not ended (its worker died, stalled, or handed it
        on: a continuation, a shutdown, a retried attempt; not a deferral, ``_take_deferred``): count
        it on META's ``resume_count``.
        A claim of a task that stopped and was queued again (a follow-up, an approval, its
        sub-agents done, a budget raise, a redrive) is a new run, not a resume, and counts
        nothing. Its own write after the claim's, because one UpdateItem cannot add on a
        condition of the value it replaces; only a takeover or a hand-off pays it. A crash
        between the two loses one count, as it loses the claim's record."""
        try:
            counted = self.table.update(
                keys.meta_key(task_id),
                Update(add={"resume_count": 1}),
                condition=Attr("lease_epoch").eq(epoch),
                returns="ALL_NEW",
            )
        except ConditionFailed:  # taken over again meanwhile: that claim counts itself
            return meta
        return counted if counted is not None else meta

    def _claim_write(self, task_id: str, update: Update, now: float) -> tuple[Item, LostClaim | None] | None:
        """The claim's conditional write of META (ALL_NEW), with the claim it took the task over
        from when that claim's worker never gave the lease back (``_lost_claim``); None when it
        may not claim.

        Taken at once when the task is claimable and its lease was given back (0: a queued task,
        a hand-off). A lease that lapsed without being given back (its worker killed, or
        stalled) refuses that write, whose old item names the claim it takes over; the write is
        then made again on the ``lease_epoch`` seen: one refused write more, only for a takeover.
        Or, refused, when the refusal's old item names an owner worker whose liveness lapsed
        (``WorkerLiveness.lapsed``): the same write again, conditional on that owner, that epoch
        and the ``lease_epoch`` seen.
        The write takes META's previous claim out of it (the latest becomes the previous): when
        that one may have no record yet (``UNRECORDED_PREVIOUS``, as after a claimer died before
        its records), the refusal's old item holds it, its record is written from there, and the
        write is made again on the ``lease_epoch`` seen (so the claim it drops is the one
        recorded): one refused write and one put more, only when the last two claims found the
        same step and none was committed since.
        Read-then-conditional rather than a transaction with a ConditionCheck on the worker's
        item: a lapsed liveness epoch never comes back (its owner can only start a new one), so
        the read cannot go stale in the way that matters, and a takeover pays one read and one
        write instead of a transaction's double price. Exactly one claimant wins; an owner
        re-adopting the task (``adopt``) races it on the same condition.
        """
        key = keys.meta_key(task_id)
        claimable = present() & status_in(list(CLAIMABLE))
        lapsed = claimable & Attr("lease_expires").lt(Decimal(repr(now)))
        given_back = claimable & Attr("lease_expires").eq(0)
        try:
            meta = self.table.update(key, update, condition=given_back & ~UNRECORDED_PREVIOUS, returns="ALL_NEW")
        except ConditionFailed as exc:
            old = plain(exc.old or {})
        else:
            return (meta, None) if meta is not None else None
        if old.get("status") not in {s.value for s in CLAIMABLE}:
            return None
        seen = Attr("lease_epoch").eq(int(old.get("lease_epoch", 0)))
        if float(old.get("lease_expires", 0)) < now:  # lapsed, or refused only to record the claim it would drop
            self._record_previous(task_id, old)
            try:
                meta = self.table.update(key, update, condition=lapsed & seen, returns="ALL_NEW")
            except ConditionFailed:
                return None  # claimed by another meanwhile
            return (meta, _lost_claim(old)) if meta is not None else None
        if "owner_worker" not in old:
            return None
        owner, epoch = str(old["owner_worker"]), int(old["owner_epoch"])
        if not self.workers.lapsed(owner, epoch, now):
            return None
        self._record_previous(task_id, old)
        takeover = claimable & Attr("owner_worker").eq(owner) & Attr("owner_epoch").eq(epoch) & seen
        try:
            meta = self.table.update(key, update, condition=takeover, returns="ALL_NEW")
        except ConditionFailed:
            return None
        log.info("task %s taken over from worker %s (liveness epoch %s lapsed)", task_id, owner, epoch)
        return (meta, _lost_claim(old)) if meta is not None else None

    def _record_previous(self, task_id: str, meta: Item) -> None:
        """Write the record of META's previous claim (``pc_*``) if it may have none yet
        (``UNRECORDED_PREVIOUS``): the claim about to be written takes it out of META."""
        if int(meta.get("pc_n", -1)) < 0 or int(meta["pc_n"]) != int(meta.get("claim_step", -1)):
            return
        record = _claim_record(task_id, int(meta["lease_epoch"]) - 1, meta["pc_w"], meta["pc_at"], meta["pc_n"],
                               meta["pc_s"], meta["pc_f"])  # fmt: skip
        with contextlib.suppress(ConditionFailed):  # written already: left whole
            self.table.put(record, condition=absent())

    @property
    def workers(self) -> WorkerLiveness:
        return WorkerLiveness(self.table)

    def adopt(self, lease: Lease, owner: ClaimOwner) -> bool:
        """Move a task this worker still holds under ``lease`` to its new liveness epoch (after
        it learned it lapsed); False when it was taken over meanwhile (or is no longer its own)."""
        try:
            self.table.update(
                keys.meta_key(lease.task_id),
                Update(set={"owner_epoch": owner.epoch}),
                condition=Attr("lease_epoch").eq(lease.epoch) & Attr("owner_worker").eq(owner.worker),
            )
        except ConditionFailed:
            return False
        return True

    def disown(self, lease: Lease) -> None:
        """The run under ``lease`` is over: the task leaves its worker's ``owner`` index (a dead
        worker's recovery lists only what it held), if the lease is still this one."""
        with contextlib.suppress(ConditionFailed):
            self.table.update(
                keys.meta_key(lease.task_id),
                Update(remove=list(OWNER_ATTRIBUTES)),
                condition=Attr("lease_epoch").eq(lease.epoch) & Attr("owner_worker").exists(),
            )

    def owned_by(self, worker: str) -> list[dict[str, Any]]:
        """The META items (plain) of the tasks claimed under ``worker``'s liveness and not yet
        disowned: one Query of the sparse ``owner`` index, then BatchGetItem."""
        ids: list[str] = []
        start: Item | None = None
        while True:
            page = self.table.query_index(GSI_OWNER, ("owner_worker", worker), descending=False, limit=500, start=start)
            ids += [str(i["owner_task"]) for i in page.items]
            if page.last_key is None:
                break
            start = page.last_key
        found: list[dict[str, Any]] = []
        for i in range(0, len(ids), 100):
            found += [plain(m) for m in self.table.batch_get([keys.meta_key(t) for t in ids[i : i + 100]])]
        return found

    def publish_live_text(self, lease: Lease, live_text: str | None, seen: Seen | None = None) -> None:
        """The tail of a streamed call's text on META (``live_text``), and what the call billed
        so far (``seen``: ``core.reservation.Seen``), fenced: the worker writes them only when
        they changed, at most once a heartbeat, and only for a task that streams."""
        self._fenced(lease, Update(set=_live(live_text, seen)))

    def extend_lease(
        self, lease: Lease, lease_seconds: float, *, live_text: str | None = None, seen: Seen | None = None
    ) -> Lease:
        """Extend the lease; ``live_text`` (the tail of a streamed call's text, best effort) and
        ``seen`` (what the call billed so far) ride on the same write, so showing the one and
        narrowing the unknown with the other cost no write of their own."""
        now = time.time()
        expires = now + lease_seconds
        sets: dict[str, Any] = {"lease_expires": expires, "heartbeat_at": now, **_live(live_text, seen)}
        self._fenced(lease, Update(set=sets), Attr("lease_expires").gt(0))
        return lease.model_copy(update={"expires_at": expires})

    def release(self, lease: Lease, *, forget_batch: bool = False) -> None:
        """Give the task back (continuation, graceful shutdown, a stop's mark met): the next
        claim may run at once. ``forget_batch``: the batch its next turn was sent in failed; the
        next claim sends anew. Not refused by a stop's mark: giving the lease back writes nothing
        of the task's, and every claim reads the stops first."""
        update = Update(set={"lease_expires": 0}, remove=["batch", "batch_settled"] if forget_batch else [])
        self._fenced(lease, update, release=True)

    def take_batch_hold(self, lease: Lease, batch_id: str) -> bool:
        """Take the settling of the windows' hold recorded with batch ``batch_id`` (its call's
        hold on the tenant's hour and the scopes' caps, kept for the batch's whole life) outside
        the step commit that reads its answer: an errored or lost batch, a discarded answer.
        True for one taker only, while that batch is the task's and its hold is unsettled, so it
        is settled once whoever meets it; False when another took it. Fenced: a run whose lease
        is gone learns it here (``LeaseLost``) and leaves the hold to the run that holds it now,
        whose claim saw whether it was settled (``Task.batch_settled``), or to the stop."""
        return self._take_batch_hold(lease.task_id, batch_id, lease)

    def take_batch_hold_at_end(self, task_id: str, batch_id: str) -> bool:
        """``take_batch_hold`` for a task that ended without its worker (cancelled or stopped
        while its batch runs): not fenced, since no worker of it can commit any more."""
        return self._take_batch_hold(task_id, batch_id, None)

    def _take_batch_hold(self, task_id: str, batch_id: str, lease: Lease | None) -> bool:
        condition = Attr("batch.id").eq(batch_id) & _unsettled(batch_id)
        if lease is not None:
            condition = fence(lease) & condition
        try:
            self.table.update(keys.meta_key(task_id), Update(set={"batch_settled": batch_id}), condition=condition)
        except ConditionFailed as exc:
            if lease is None or fence_holds(exc.old, lease):
                return False
            raise refused(lease, exc.old) from exc
        return True

    def start_workspace(self, lease: Lease, ref: WorkspaceRef) -> None:
        """Record the starting files a clone made (``Task.workspace_start``, and ``workspace``,
        what a takeover restores), fenced and once: only while no start is recorded and no step
        has committed, so a zombie's clone never replaces the one a task runs on.

        A refusal by the fence is ``LeaseLost`` (which part, as for every worker write); one
        the fence passes is the task's own state, the same at every claim (a step committed, a
        start recorded): ``WorkspaceStartRefused``, a deterministic fault that ends the task,
        never a lost lease, which would leave it held and cloned again by every claim."""
        value = ref.model_dump()
        condition = fence(lease) & Attr("workspace_start").not_exists() & Attr("step").eq(0)
        update = Update(set={"workspace_start": value, "workspace": value})
        try:
            self.table.update(keys.meta_key(lease.task_id), update, condition=condition)
        except ConditionFailed as exc:
            if exc.old is None or not fence_holds(exc.old, lease):
                raise refused(lease, exc.old) from exc
            why = "a start is already recorded" if "workspace_start" in exc.old else f"it is at step {exc.old['step']}"
            raise WorkspaceStartRefused(
                f"task {lease.task_id}: workspace.git: a clone is recorded only as step 0's files; {why}"
            ) from exc

    def _fenced(
        self, lease: Lease, update: Update, extra: ConditionBase | None = None, *, release: bool = False
    ) -> None:
        """A write of the lease itself (heartbeat, live text, a workspace's start) carries the
        whole fence, as every worker write does: a cancel moves no epoch, so its ``running`` is
        what keeps a cancelled task's worker from writing to it, and a worker learns at its next
        heartbeat that its task ended or is being stopped. A ``release`` carries the epoch
        alone: giving the lease back writes nothing of the task's."""
        condition: ConditionBase = Attr("lease_epoch").eq(lease.epoch) if release else fence(lease)
        try:
            self.table.update(keys.meta_key(lease.task_id), update, condition=condition & extra if extra else condition)
        except ConditionFailed as exc:
            old = exc.old
            if old is not None and not fence_holds(old, lease):
                raise refused(lease, old) from exc
            raise LeaseLost(f"lease epoch {lease.epoch} of task {lease.task_id} is no longer current") from exc

    def claims(self, task_id: str) -> list[ClaimRecord]:
        """Every claim of the task's lease, oldest first."""
        return [
            ClaimRecord(
                epoch=d["epoch"],
                worker=d["worker"],
                at=d["at"],
                prev_heartbeat_at=d.get("prev_heartbeat_at"),
                claimed_from=d.get("claimed_from"),
            )
            for d in (plain(i) for i in self.table.query(keys.task_pk(task_id), prefix=keys.CLAIM))
        ]
