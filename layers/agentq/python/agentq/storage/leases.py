"""A task's lease: claim, extend, release, the claim history, and the fence every worker write carries.

A claim is one conditional UpdateItem of META: it succeeds only while no live lease exists, and
bumps ``lease_epoch``. Every write a worker makes carries the lease fence (``table.fence``): a
worker whose lease was taken over (a zombie woken from SIGSTOP) can write nothing. ``why_fenced``
tells which part of the fence refused a write, for every repository that writes fenced (tasks,
steps, budgets, spawns, approvals, effects, notes), so it depends on none of them.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq import observe
from agentq.core.errors import LeaseLost, TaskNotFound
from agentq.core.models import Lease, Task, TaskStatus
from agentq.core.records import ClaimRecord
from agentq.storage import keys
from agentq.storage.table import ConditionFailed, Item, Table, Update, plain, present, status_in
from agentq.storage.task_items import TaskItems


def why_fenced(table: Table, lease: Lease) -> LeaseLost:
    """Explain a write the fence refused: the epoch moved on, the task stopped, or the step moved."""
    current = _read_meta(table, lease.task_id)
    if current is None:
        return LeaseLost(f"task {lease.task_id} no longer exists")
    epoch, status, step = int(current["lease_epoch"]), TaskStatus(current["status"]), int(current["step"])
    if epoch != lease.epoch:
        return LeaseLost(f"lease epoch {lease.epoch} of task {lease.task_id} superseded by {epoch}")
    if status is not TaskStatus.RUNNING:
        err = LeaseLost(f"task {lease.task_id} is {status.value}; the worker must stop")
        err.details["status"] = status
        return err
    return LeaseLost(f"task {lease.task_id} step moved to {step} under epoch {lease.epoch}")


def _read_meta(table: Table, task_id: str) -> Item | None:
    return table.get(keys.meta_key(task_id))


LIVE_TEXT_CHARS = 1000  # of a call in flight: enough to watch, small enough for one write unit


class TaskLeases(TaskItems):
    def claim(self, task_id: str, worker: str, lease_seconds: float) -> tuple[Lease, Task] | None:
        """Take the task if it is claimable and no live lease exists; bumps the epoch.

        Returns None when another worker holds a live lease or the task is not runnable
        (finished, paused, waiting). A conditional UpdateItem of META, then the claim's own
        ``CLAIM#epoch`` record and a read of the submission. The record is history only: a
        crash between the two loses one line of it, never the lease.
        """
        now = time.time()
        try:
            meta = self.table.update(
                keys.meta_key(task_id),
                Update(
                    set={
                        "lease_owner": worker,
                        "lease_expires": now + lease_seconds,
                        "status": TaskStatus.RUNNING.value,
                        "updated_at": now,
                        "heartbeat_at": now,
                        "last_claimed_at": now,
                    },
                    add={"lease_epoch": 1, "claim_count": 1},
                    set_if_absent={"started_at": now, "first_claimed_at": now},
                    remove=["live_text"],  # a lapsed lease's call in flight: never shown as this one's
                    # where the claim falls in the task's event log (storage/events.py), and whether
                    # it took a running task over: the values as they were before this write
                    copy_from={
                        "prev_heartbeat_at": ("heartbeat_at", now),
                        "claim_step": ("step", 0),
                        "claim_seq": ("seq", 0),
                        "claimed_from": ("status", TaskStatus.QUEUED.value),
                    },
                ),
                condition=present()
                & status_in([TaskStatus.QUEUED, TaskStatus.RUNNING])
                & Attr("lease_expires").lt(Decimal(repr(now))),
                returns="ALL_NEW",
            )
        except ConditionFailed:
            return None
        assert meta is not None
        epoch = int(meta["lease_epoch"])
        claim = {
            **keys.item_key(task_id, keys.claim_sk(epoch)),
            "epoch": epoch,
            "worker": worker,
            "at": now,
            "prev_heartbeat_at": meta["prev_heartbeat_at"],
            "step": meta["claim_step"],
            "seq": meta["claim_seq"],
            "claimed_from": meta["claimed_from"],
        }
        self.table.put(claim)
        sub = self.table.get(keys.submission_key(task_id))
        if sub is None:
            raise TaskNotFound(f"task {task_id!r} has no submission", field="task_id")
        task = self._decode(meta, sub)
        observe.task_status_changed(task_id, task.tenant, TaskStatus.RUNNING.value, epoch=epoch, worker=worker)
        return Lease(task_id=task_id, owner=worker, epoch=epoch, expires_at=task.lease_expires), task

    def extend_lease(self, lease: Lease, lease_seconds: float, *, live_text: str | None = None) -> Lease:
        """Extend the lease; ``live_text`` (the tail of a streamed call's text, best effort) rides
        on the same write, so showing it costs no write of its own."""
        now = time.time()
        expires = now + lease_seconds
        sets: dict[str, Any] = {"lease_expires": expires, "heartbeat_at": now}
        if live_text:
            sets["live_text"] = live_text[-LIVE_TEXT_CHARS:]
        self._fenced(lease, Update(set=sets), Attr("lease_expires").gt(0))
        return lease.model_copy(update={"expires_at": expires})

    def release(self, lease: Lease, *, forget_batch: bool = False) -> None:
        """Give the task back (continuation, graceful shutdown): the next claim may run at once.
        ``forget_batch``: the batch its next turn was sent in failed; the next claim sends anew."""
        self._fenced(lease, Update(set={"lease_expires": 0}, remove=["batch"] if forget_batch else []))

    def _fenced(self, lease: Lease, update: Update, extra: ConditionBase | None = None) -> None:
        condition = Attr("lease_epoch").eq(lease.epoch)
        try:
            self.table.update(keys.meta_key(lease.task_id), update, condition=condition & extra if extra else condition)
        except ConditionFailed as exc:
            raise LeaseLost(f"lease epoch {lease.epoch} of task {lease.task_id} is no longer current") from exc

    def claims(self, task_id: str) -> list[ClaimRecord]:
        """Every claim of the task's lease, oldest first."""
        return [
            ClaimRecord(epoch=d["epoch"], worker=d["worker"], at=d["at"], prev_heartbeat_at=d.get("prev_heartbeat_at"))
            for d in (plain(i) for i in self.table.query(keys.task_pk(task_id), prefix=keys.CLAIM))
        ]
