"""The stop button: ``stop`` cancels every running and queued task of one scope of a tenant
(``core.stops``: an end user, an agent, an API key, the tenant), children included, and refuses
new work in that scope until ``resume``.

The order is the mechanism (ARCHITECTURE invariant 17): the stop is stored first, then the
scope's unfinished tasks are listed and each tree is cancelled with ``operations.cancel``, whose
transition to ``cancelled`` is what fences every later step commit of the task (a commit requires
``status = running``). A task the listing cannot have seen was created, or claimed, after the
stop was stored, and every path that creates or runs a task reads the stops first: a submission,
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
from agentq.core.models import Task, TaskStatus
from agentq.core.stops import ScopeNotYours, StopRecord, StopScope
from agentq.queueing.queues import TaskQueues
from agentq.resources import LIVE_SHARDS
from agentq.storage.api_keys import KeyNotFound
from agentq.storage.container import Storage
from agentq.storage.running_slots import RunningSlots

log = logging.getLogger("agentq.control")

CANCEL_THREADS = 16  # trees cancelled at once: a stop of 1,000 running tasks is bound by round trips


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


def scope_tasks(store: Storage, tenant: str, scope: StopScope) -> list[Task]:
    """The unfinished tasks of ``scope``: the ``live`` index, META of each (the tenant's only
    read with their submissions), those the scope covers."""
    with ThreadPoolExecutor(max_workers=LIVE_SHARDS) as pool:  # the shards at once: a stop is waited for
        ids = [i for shard in pool.map(lambda n: list(store.tasks.live_task_ids(shards=[n])), range(LIVE_SHARDS))
               for i in shard]  # fmt: skip
    mine: list[str] = []
    for i in range(0, len(ids), 100):
        mine += [str(m["task_id"]) for m in store.tasks.metas(ids[i : i + 100]) if m.get("tenant") == tenant]
    tasks: list[Task] = []
    for i in range(0, len(mine), 50):
        tasks += [t for t in store.tasks.get_many(mine[i : i + 50]) if not t.status.terminal and scope.covers(t)]
    return tasks


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
    """Store the stop of ``scope`` (idempotent), then cancel every unfinished tree in it."""
    owned_scope(store, tenant, scope)
    record, created = store.stops.put(tenant, scope, by=by, reason=reason)
    report = StopReport(record, created)
    found = scope_tasks(store, tenant, scope)
    ids = {t.task_id for t in found}
    # A tree is cancelled from its highest task in the scope; a child under it goes with it.
    roots = [t for t in found if t.parent_id not in ids]
    why = f"stopped: {scope}" + (f" ({reason})" if reason else "")
    error = {"code": "cancelled", "message": why}

    def fence(task: Task) -> bool:
        """The write that ends the task's commits: one conditional update, before anything else."""
        try:
            store.tasks.transition(task.task_id, TaskStatus.CANCELLED, error=error)
        except (IllegalTransition, TaskNotFound):
            return False  # it ended (or was purged) meanwhile
        return True

    def cancel_tree(task: Task) -> list[str]:
        """The rest of a cancel for the tree (its fan-out stopped, its children out of the scope
        cancelled, slots, budgets, endings), its fenced tasks counted as cancelled."""
        try:
            return cancel(store, task.task_id, tenant=tenant, fanout=fanout, reason=why, queues=queues, slots=slots,
                          fenced=fenced)  # fmt: skip
        except (IllegalTransition, TaskNotFound):
            return []  # it ended on its own before the fence

    with ThreadPoolExecutor(max_workers=CANCEL_THREADS, thread_name_prefix="agentq-stop") as pool:
        fenced = {t.task_id: t for t, ok in zip(found, pool.map(fence, found), strict=True) if ok}
        done = {i for ids_cancelled in pool.map(cancel_tree, roots) for i in ids_cancelled}
    # What the stop found unfinished and is cancelled now: by this stop, or by a worker (or a
    # fan-out's stop) that met the stop first.
    listed = [t.task_id for t in found]
    for i in range(0, len(listed), 50):
        done.update(t.task_id for t in store.tasks.get_many(listed[i : i + 50]) if t.status is TaskStatus.CANCELLED)
    report.cancelled = sorted(done)
    running = {t.task_id for t in found if t.status is TaskStatus.RUNNING}
    report.were_running = [t for t in report.cancelled if t in running]
    log.info("tenant %s: %s stopped by %s; %d tasks cancelled", tenant, scope, by, len(report.cancelled))
    return report


def resume(store: Storage, tenant: str, scope: StopScope) -> StopRecord | None:
    """Lift the stop of ``scope``: the stop removed, or None if it was not stopped. The tasks it
    cancelled stay cancelled; new ones start again."""
    owned_scope(store, tenant, scope)
    return store.stops.delete(tenant, scope)
