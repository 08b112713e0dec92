"""Purge: delete everything a finished task left behind (its partition, its budget with it on
META, its payloads). Idempotent, and refuses a task that is still live.

A finished task may still be held by its worker: a task cancelled while its worker waits on a
model call is ``cancelled`` at once, but its worker learns it only at its next commit, and gives
back the task's running slots (``RunningSlots.release``, which reads them from META) and lets go
of it (``Leases.disown``) only after that. Purged before, the slots were never given back (META,
which names them, was gone: one slot of the tenant's limit lost for good), and the worker's
prepared step landed in the purged partition. So META is deleted only once the task holds no
slot (``slots`` absent) and no live worker owns it (``owner_worker`` absent, or that worker's
liveness lapsed: it died holding it, and a dead worker writes nothing more); otherwise the purge
is refused, nothing deleted, and is to be tried again once the worker lets go.

A fork cut short (``Tasks.fork``) left a placeholder META with no status: purged once it expired,
refused before (the fork may still be copying)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from boto3.dynamodb.conditions import Attr

from agentq.core.errors import IllegalTransition
from agentq.core.models import TERMINAL_STATUSES
from agentq.storage import keys
from agentq.storage.serdes import Payloads
from agentq.storage.table import ConditionFailed, Item, Table, plain, present, status_in
from agentq.storage.tasks import FORK_PENDING
from agentq.storage.workers import WorkerLiveness

# A finished task its worker has let go of: no running slot named on META, no worker owning it.
LET_GO = Attr("slots").not_exists() & Attr("owner_worker").not_exists()


@dataclass(frozen=True)
class Purged:
    items: int
    objects: int


class Purge:
    def __init__(self, table: Table, payloads: Payloads) -> None:
        self.table = table
        self.payloads = payloads

    def task(self, task_id: str, *, attempts: int = 8, sleep: Callable[[float], None] = time.sleep) -> Purged:
        """Safe to run again, and on a task whose META is already gone (the TTL path) or still
        there but terminal (then META goes first, so a purge cut short never leaves a visible
        task without its history). ``attempts`` bounds the retries of unprocessed deletes."""
        finished = status_in(TERMINAL_STATUSES)
        # a fork cut short, its placeholder past its expiry (TTL deletes it within days; a purge need not wait)
        cut_short = Attr(FORK_PENDING).exists() & Attr("expires_at").lt(int(time.time()))
        try:
            old = self.table.delete(keys.meta_key(task_id), condition=~present() | (finished & LET_GO) | cut_short)
        except ConditionFailed as exc:
            old = self._delete_let_go(task_id, plain(exc.old or {}))
        rest = self.table.query(keys.task_pk(task_id), keys_only=True)
        self.table.batch_delete(rest, attempts=attempts, sleep=sleep)
        objects = self.payloads.delete_prefix(keys.payload_prefix(task_id))
        return Purged(items=len(rest) + (1 if old else 0), objects=objects)

    def _delete_let_go(self, task_id: str, meta: Item) -> Item | None:
        """META's delete was refused as ``meta`` stood: a live task, or a finished one its worker
        has not let go of yet (IllegalTransition, nothing deleted); or one whose owner died
        holding it, deleted now on that very owner."""
        if FORK_PENDING in meta:
            raise IllegalTransition(
                f"task {task_id} is a fork still being copied (or cut short: its placeholder expires at "
                f"{meta.get('expires_at')}); nothing was deleted; purge it again after that",
                field="task_id",
            )
        status = meta.get("status", "live")
        if status not in {s.value for s in TERMINAL_STATUSES}:
            raise IllegalTransition(f"task {task_id} is {status}; only a finished task is purged", field="task_id")
        if meta.get("slots"):
            slots = ", ".join(str(pk) for pk in meta["slots"])
            raise IllegalTransition(
                f"task {task_id} is {status} but its worker has not let go of it yet: it still holds running "
                f"slots ({slots}); nothing was deleted; purge it again once its worker lets go",
                field="task_id",
            )
        worker, epoch = str(meta.get("owner_worker", "")), int(meta.get("owner_epoch", 0))
        if worker and not WorkerLiveness(self.table).lapsed(worker, epoch):
            raise IllegalTransition(
                f"task {task_id} is {status} but its worker {worker} has not let go of it yet; nothing was "
                "deleted; purge it again once its worker lets go",
                field="task_id",
            )
        dead_owner = Attr("owner_worker").eq(worker) & Attr("owner_epoch").eq(epoch) if worker else LET_GO
        condition = ~present() | (status_in(TERMINAL_STATUSES) & Attr("slots").not_exists() & dead_owner)
        try:
            return self.table.delete(keys.meta_key(task_id), condition=condition)
        except ConditionFailed as exc:  # changed meanwhile (claimed by no one: a finished task); say so
            raise IllegalTransition(
                f"task {task_id} changed while it was being purged; nothing was deleted; purge it again",
                field="task_id",
            ) from exc
