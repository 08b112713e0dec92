"""The stop button: ``stop`` cancels every running and queued task of one scope of a tenant
(``core.stops``: an end user, an agent, an API key, the tenant), children included, and refuses
new work in that scope until ``resume``.

The order is the mechanism (ARCHITECTURE invariant 17): the stop is stored first, then the
scope's unfinished tasks are listed (the tenant's entries in the sparse ``tenant_live`` index,
which name each task's user, key and agent: no task is read to list them) and each is moved to
``cancelled``, the write that fences every later step commit of the task (a commit requires
``status = running``), after a mark (``stopping``) that fences them already and that no step
committed meanwhile can refuse; then each tree's cancel is finished with ``operations.cancel``. A task
the listing cannot have seen was created, or claimed, after the stop was stored, and every path that creates or runs a task reads the stops first: a submission,
a follow-up and a schedule's fire are refused (``ScopeStopped``), and a dispatcher's delivery of a
task in a stopped scope cancels it instead of running it (``queueing.dispatch._attempt``). So
once ``stop`` returns no step of the scope commits, until ``resume``.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentq.control.operations import cancel
from agentq.core.errors import IllegalTransition, TaskNotFound
from agentq.core.faults import crash_point
from agentq.core.models import Task, TaskStatus
from agentq.core.stops import ScopeNotYours, StopRecord, StopScope
from agentq.queueing.queues import TaskQueues
from agentq.storage import keys
from agentq.storage.api_keys import KeyNotFound
from agentq.storage.container import Storage
from agentq.storage.event_writes import TOGETHER
from agentq.storage.running_slots import RunningSlots

log = logging.getLogger("agentq.control")

THREADS = 32  # fences, batch reads, trees cancelled at once: a stop of 1,000 running tasks is bound by round trips
BATCH = 25  # at most this many tasks read in one BatchGetItem (META and submission: 50 keys)
# A batch's fences written together this many times at most, each from a new read of the tasks
# that moved since the last (a step committed): with turns of seconds a batch of 1,000 running
# tasks has a few such tasks, and fencing each alone, one after another, was the stop's tail.
ROUNDS = 3


@dataclass
class StopReport:
    stop: StopRecord
    created: bool  # False: the scope was stopped already (its first stop is kept; the sweep ran again)
    cancelled: list[str] = field(default_factory=list)  # every task this stop cancelled, children included
    # Of those, the ones a worker was running: it stops at its next step boundary (its commit is
    # fenced); a side effect in flight there is left as a cancel leaves it (EFFECT# started).
    were_running: list[str] = field(default_factory=list)


def owned_scope(store: Storage, tenant: str, scope: StopScope) -> StopScope:
    """``scope`` if ``tenant`` owns it: its own name, its own key (another tenant's key is not
    found, as an unknown one is: no oracle); users and agents are named within the tenant."""
    if scope.kind == "tenant" and scope.value != tenant:
        raise ScopeNotYours(f"tenant: a key of tenant {tenant!r} stops only its own tenant", field="tenant")
    if scope.kind == "key":
        key = store.api_keys.get(scope.value)
        if key is None or key.tenant != tenant:
            raise KeyNotFound(f"key: no API key {scope.value!r} in this tenant", field="key")
    return scope


def in_scope(entry: dict[str, Any], tenant: str, scope: StopScope) -> bool | None:
    """Whether the task of a ``tenant_live`` index entry of ``tenant`` (``Tasks.unfinished_of_tenant``)
    is in ``scope``, from the entry alone; None when the entry cannot tell: a task created before
    META carried its agent's name, whose submission is read to tell (``StopScope.covers``)."""
    if scope.kind == "tenant":
        return scope.value == tenant
    if scope.kind == "user":
        return entry.get("user_pk") == keys.user_tasks_pk(tenant, scope.value)
    if scope.kind == "key":
        return entry.get("key_id") == scope.value
    return entry["agent"] == scope.value if "agent" in entry else None


def scope_entries(store: Storage, tenant: str, scope: StopScope) -> list[dict[str, Any]]:
    """The ``tenant_live`` index entries of the unfinished tasks of ``tenant`` that may be in
    ``scope`` (those the entry cannot tell about too): one Query a page of the tenant's
    unfinished tasks, no read of any task."""
    return [e for e in store.tasks.unfinished_of_tenant(tenant) if in_scope(e, tenant, scope) is not False]


def scope_tasks(store: Storage, tenant: str, scope: StopScope) -> list[Task]:
    """The unfinished tasks of ``scope``, read (META and submission, in batches at once)."""
    ids = [e["task_id"] for e in scope_entries(store, tenant, scope)]
    return [t for t in _read(store, ids) if not t.status.terminal and scope.covers(t)]


def batches(ids: list[str], most: int = BATCH) -> list[list[str]]:
    """``ids`` cut for ``THREADS`` threads: at most ``most`` a batch, and as many batches as
    threads while there are tasks enough."""
    size = max(1, min(most, -(-len(ids) // THREADS)))
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _read(store: Storage, ids: list[str]) -> list[Task]:
    """The tasks of ``ids`` (a BatchGetItem a batch, the batches at once), in their order."""
    with ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="agentq-stop") as pool:
        return [t for batch in pool.map(store.tasks.get_many, batches(ids)) for t in batch]


def stop(
    store: Storage,
    tenant: str,
    scope: StopScope,
    *,
    by: str | None = None,
    reason: str = "",
    fanout: Any = None,
    queues: TaskQueues | None = None,
    slots: RunningSlots | None = None,
) -> StopReport:
    """Store the stop of ``scope`` (idempotent), then cancel every unfinished tree in it.

    The tasks listed are fenced in batches of up to ``TOGETHER``, the batches at once
    (``THREADS``). First each batch is marked as stopping (one transaction, no read: from then
    on its workers commit nothing), so every task stops one round trip after the listing. Then
    a batch is read (one BatchGetItem) and moved to ``cancelled`` in one transaction made from
    that read (the event each logs needs META's ``seq``; no read of its own): 1,000 tasks in 32
    marks, 32 reads and 32 moves. A task that moved anyway between its batch's read and write (a
    claim, a message) is read again with the others that moved and moved with them in one more
    transaction (``ROUNDS``). Then each tree's cancel is finished (``operations.cancel`` with
    ``fenced=``: the tasks as read, with the status each was fenced from), the trees at once."""
    owned_scope(store, tenant, scope)
    record, created = store.stops.put(tenant, scope, by=by, reason=reason)
    report = StopReport(record, created)
    entries = scope_entries(store, tenant, scope)
    ids = [e["task_id"] for e in entries if in_scope(e, tenant, scope)]
    unsure = [e["task_id"] for e in entries if in_scope(e, tenant, scope) is None]
    ids += [t.task_id for t in _read(store, unsure) if not t.status.terminal and scope.covers(t)]
    why = f"stopped: {scope}" + (f" ({reason})" if reason else "")
    error = {"code": "cancelled", "message": why}

    def fence_one(task_id: str) -> tuple[Task, str] | None:
        """The write that ends the task's commits: one conditional transition made from a read
        of its own, the task as that read saw it and the status the write replaced (pinned,
        so a claim in between is seen); None if it ended (or was purged) before."""
        read = store.tasks.read_many([task_id])
        if not read or read[0][0].status.terminal:
            return None
        task, meta = read[0]
        try:
            return task, store.tasks.transition(task_id, TaskStatus.CANCELLED, error=error, read=meta)
        except (IllegalTransition, TaskNotFound):
            return None

    def mark(batch: list[str]) -> None:
        """Up to ``TOGETHER`` tasks marked as stopping, in one transaction: from then on their
        workers write nothing (``storage.table.fence``), step commits included."""
        store.tasks.mark_stopping(batch, str(scope))

    def fence(batch: list[str]) -> list[tuple[Task, str | None]]:
        """Read up to ``TOGETHER`` marked tasks (one BatchGetItem) and move them to
        ``cancelled`` in one transaction made from that read: each task, with the status it was
        fenced from (None: it had ended). Those that moved anyway since their read (a claim, a
        message; no step commits once marked) are read again together and moved in one more
        transaction, up to ``ROUNDS`` times; one still moving then is moved alone."""
        out: dict[str, tuple[Task, str | None]] = {}
        pending = batch
        for _ in range(ROUNDS):
            reads = store.tasks.read_many(pending)
            out.update((task.task_id, (task, None)) for task, _ in reads)
            live = [(task, meta) for task, meta in reads if not task.status.terminal]
            moved = (
                store.tasks.move_together([meta for _, meta in live], TaskStatus.CANCELLED, error=error) if live else []
            )
            for (task, _), was in zip(live, moved, strict=True):
                out[task.task_id] = (task, was)
            pending = [task.task_id for (task, _), was in zip(live, moved, strict=True) if was is None]
            if not pending:
                break
        for task_id in pending:
            # A task fenced alone is as its own read saw it (its epoch: the slots it gives back).
            alone = fence_one(task_id)
            if alone is not None:
                out[task_id] = alone
        return [out[task_id] for task_id in batch if task_id in out]

    def cancel_tree(task: Task) -> list[str]:
        """The rest of a cancel for the tree (its fan-out stopped, its children out of the scope
        cancelled, slots, budgets, endings), its fenced tasks counted as cancelled."""
        try:
            return cancel(store, task.task_id, tenant=tenant, fanout=fanout, reason=why, queues=queues, slots=slots,
                          fenced=fenced)  # fmt: skip
        except (IllegalTransition, TaskNotFound):
            return []  # it ended on its own before the fence

    with ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="agentq-stop") as pool:
        # Every batch marked before any is moved: the marks are what stops the workers, and
        # the cheaper writes (no event, no read before), so none waits behind another's move.
        together = batches(ids, TOGETHER)
        list(pool.map(mark, together))
        crash_point("after_stop_marks")
        reads = [r for fences in pool.map(fence, together) for r in fences]
        moved = {t.task_id: m for t, m in reads}
        # Each fenced task as it was before its fence, for the cancel's bookkeeping (a task
        # fenced queued gives its slots back): the fence required the status read, and changed
        # nothing else it reads.
        fenced = {t.task_id: t.model_copy(update={"status": TaskStatus(m)}) for t, m in reads if m}
        # A tree is cancelled from its highest task in the scope; a child under it goes with it.
        roots = [t for t in fenced.values() if t.parent_id not in fenced]
        done = {i for ids_cancelled in pool.map(cancel_tree, roots) for i in ids_cancelled}
        # And what a worker (or a fan-out's stop) cancelled first, having met the stop: read
        # cancelled, or (rarely) found ended by its fence.
        unfenced = [t.task_id for t, _ in reads if not moved[t.task_id] and not t.status.terminal]
        found = [t for t, _ in reads] + [
            t for batch in pool.map(store.tasks.get_many, batches(unfenced)) for t in batch
        ]
    done.update(t.task_id for t in found if t.status is TaskStatus.CANCELLED)
    report.cancelled = sorted(done)
    report.were_running = [t for t in report.cancelled if moved.get(t) == TaskStatus.RUNNING.value]
    log.info("tenant %s: %s stopped by %s; %d tasks cancelled", tenant, scope, by, len(report.cancelled))
    return report


def resume(store: Storage, tenant: str, scope: StopScope) -> StopRecord | None:
    """Lift the stop of ``scope``: the stop removed, or None if it was not stopped. The tasks it
    cancelled stay cancelled; new ones start again."""
    owned_scope(store, tenant, scope)
    return store.stops.delete(tenant, scope)
