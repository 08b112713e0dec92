"""The sweeper: every unfinished task always has a way forward.

A task moves only when a message for it is received, so its message is its lifeline, and
there are ways to lose one: SQS's redrive backstop moves it to a DLQ (a message that crashed
its worker too often), a worker dies between sending a continuation and deleting its own
message, an operator purges a queue. Such a task stays ``queued`` or ``running`` forever with
nothing to resume it, not even a redrive.

So the sweeper, periodically (a scheduled Lambda in AWS, a thread in ``agentq dev``), lists
the unfinished tasks from the sparse ``live`` index (``resources.GSI_LIVE``: keys only, and
only tasks that have not ended carry the keys), reads their META items, and sends a ``swept``
message for each ``queued`` or ``running`` task that shows no sign of life for
``stale_after`` seconds: its lease lapsed that long ago and nothing was written to it since
(no claim, commit, heartbeat, retry note or release), or since the message a deferral or a
delivery's retry waits for was due (``core.status.SILENT_UNTIL``: a cap deferral to midnight
comes back in 15-minute hops, each its own silence), or since a sweep last re-enqueued it
(``core.status.SWEPT_AT``: written before the ``swept`` message is sent, conditional on the
value the listing read, so the next sweep sends no second message while the first waits in a
backlog, and of two overlapping sweeps only one sends; one whose message was lost too is swept
again ``stale_after`` later). ``stale_after`` must be longer than the
longest silence a healthy task keeps otherwise: SQS's longest delay (15 minutes) plus the
visibility timeout; with ``SILENT_UNTIL`` honoured, a shorter one (the local stack's 120 s)
never sweeps a deferral that is still legitimate. A sweep that is wrong anyway is harmless: a claim is
fenced, a message for a task that is leased waits for the lease, and one for a task that has
ended is deleted. ``waiting`` and ``paused`` tasks are woken by their own messages (the
fan-out's, a person's decision) and are left alone, but for two: a task waiting on a remote
agent's task, or on its economy batch, wakes itself with a delayed look (``remote_poll``,
``batch_poll``) queued after its park commits (and a batch look queues the next), and a worker
that dies between the two leaves it nothing to wake it. Its park (and each batch look, before
it queues the next) records when the look is due (``LOOK_DUE``); one still waiting
``stale_after`` past it has lost its look, and gets one of its kind (a look that was only late
finds the next one due later, and is dropped: ``queueing.dispatch._looks``). Each sweep counts what it re-enqueued
(metric ``tasks_swept``, 0 in a healthy fleet).

A ``queued`` task parked over its tenant's, its key's or its tier's running limit (a ``WAIT`` item in the slot's
waiting list, ``storage.running_slots``) is silent by design and is left alone however long it
waits: a release wakes it in its turn, and re-sending it would only be refused again and jump
the waiting order. Only a queued task with neither a ``WAIT`` item nor a sign of life is swept
(a wake lost between taking its item and sending its message). And since a release wakes one
waiter per slot it frees, room that appeared otherwise (the deployment's default limit raised,
``default_max_running``) would wake nobody: each sweep wakes, for every tenant with waiters,
as many as its slot has room for (and for each of its tiers with a limit, ``tier_limits``: a
raised tier capacity). Likewise for the fleet (``storage.fleet_slots``): it wakes
the room a raised capacity made, and first marks waiting again every tenant with a fleet list
(idempotent), since the fleet's wakes find waiting tenants only by those marks and a crash can
lose one, leaving that tenant's waiters with nothing ever to wake them.

A ``blocked`` task has no message either: it moves when a dependency's ender (or its
submitter) walks to it (``queueing.endings``), and a walk cut short (a cancel whose Query was
throttled, an ender killed part way) left the rest of a chain blocked for good, since a blocked
task's ending was never reported again (it has no message to redeliver). So a blocked task
quiet for ``stale_after`` with a dependency that ended (or is gone) as long ago is moved on as
the walk would have moved it (``endings.resolve``: queued and sent when every dependency
succeeded, cancelled ``dependency_failed`` down the chain when one did not); one whose
dependencies all still run is left to wait, read again each sweep (two BatchGetItems a hundred
blocked tasks). Each one moved is counted with the swept (``released``).

A task parked ``waiting``, ``paused`` or ``idle`` holds no running slot (its worker gives them
back after the run that parked it), and one whose worker died between the park and that release
has them given back by its message's next delivery (``dispatch._gate.release_parked``). When no
delivery comes (its message lost as above), nothing else would: a parent holds its children's
slot until woken, an idle conversation maybe forever. So a parked task whose META still names
slots ``stale_after`` after its last write has them given back here (``FairShare.release``: the
same idempotent release, conditional on the task being neither queued nor running, which wakes
the waiters the slots have room for; ``given_back``). Found in the METAs the pass reads anyway:
no call is added but the release's own.

A task a worker process holds under its liveness (``storage.workers``) has a long lease and an
invisible message; the live workers hand on a dead peer's tasks within seconds
(``queueing.recovery``). When none is left to notice (the whole fleet died), each sweep first
recovers every worker whose liveness lapsed by the wall clock, so its tasks come back then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from agentq import observe
from agentq.core.models import Task
from agentq.core.status import LOOK_DUE, SILENT_UNTIL, SWEPT_AT, TaskStatus
from agentq.queueing.endings import resolve
from agentq.queueing.fairness import FairShare
from agentq.queueing.queues import MessageKind, TaskQueues
from agentq.queueing.recovery import recover_lapsed
from agentq.queueing.task_reads import read_tasks
from agentq.storage import fleet_slots, keys
from agentq.storage.container import Storage
from agentq.storage.running_slots import RunningSlots, key_pk
from agentq.storage.tier_slots import is_tier_pk, tier_pk

log = logging.getLogger("agentq.sweeper")

# The longest a healthy task can stay silent: a message delayed by SQS's maximum (a retry's
# backoff, a deferral), received after its visibility timeout; plus a minute of slack.
DEFAULT_STALE_AFTER_SECONDS = 900 + 60
BATCH = 100  # BatchGetItem's limit
STRANDABLE = (TaskStatus.QUEUED.value, TaskStatus.RUNNING.value)
ENDED = frozenset(s.value for s in TaskStatus if s.terminal)
PARKED = frozenset({TaskStatus.WAITING.value, TaskStatus.PAUSED.value, TaskStatus.IDLE.value})  # hold no slot


@dataclass
class SweepReport:
    listed: int = 0  # tasks in the live index
    swept: list[str] = field(default_factory=list)  # re-enqueued
    looked: list[str] = field(default_factory=list)  # waiting on a remote agent or a batch, its look lost: sent one
    recovered: list[str] = field(default_factory=list)  # tasks of dead workers handed on
    unlisted: int = 0  # ended tasks still in the index, taken out
    parked: int = 0  # silent but waiting for a slot: left alone
    woken: list[str] = field(default_factory=list)  # waiters sent because their tenant has room
    released: list[str] = field(default_factory=list)  # blocked past a dependency's end: moved on
    given_back: list[str] = field(default_factory=list)  # parked still naming slots: given back


def sweep(
    store: Storage,
    queues: TaskQueues,
    *,
    stale_after: float,
    now: float | None = None,
    default_max_running: int | None = None,
    fleet_capacity: int | None = None,
    tier_limits: Mapping[str, int] | None = None,
) -> SweepReport:
    """One pass over the unfinished tasks (see the module). ``default_max_running``: the
    deployment's ``AGENTQ_DEFAULT_TENANT_MAX_RUNNING``, to know the room of a tenant without
    an override; ``fleet_capacity`` (``AGENTQ_FLEET_CAPACITY``), the fleet's room; ``tier_limits``
    (``Defaults.tier_limits``), each tier's room per tenant."""
    now = time.time() if now is None else now
    report = SweepReport()
    report.recovered = recover_lapsed(store, queues, now=now)
    ids = list(store.tasks.live_task_ids())
    report.listed = len(ids)
    stranded: dict[str, float | None] = {}  # task -> when a sweep last re-enqueued it, as listed
    lost_looks: dict[str, float] = {}  # task -> the overdue look's due, as listed
    waiting_tenants: set[str] = set()  # tenants with a queued task holding no slot (may be parked)
    blocked: list[str] = []  # blocked and quiet for stale_after: its dependencies are looked at
    holding: list[str] = []  # parked, quiet for stale_after, and still naming slots
    for start in range(0, len(ids), BATCH):
        for meta in store.tasks.metas(ids[start : start + BATCH]):
            status, due = str(meta.get("status")), meta.get(LOOK_DUE)
            if status in PARKED and meta.get("slots") and now - float(meta.get("updated_at") or 0) >= stale_after:
                holding.append(str(meta["task_id"]))
            if status == TaskStatus.WAITING.value and due is not None and now - float(due) >= stale_after:
                lost_looks[str(meta["task_id"])] = float(due)
                continue
            if status == TaskStatus.BLOCKED.value:
                if now - float(meta.get("updated_at") or 0) >= stale_after:
                    blocked.append(str(meta["task_id"]))
                continue
            if status not in STRANDABLE:
                if TaskStatus(status).terminal:
                    store.tasks.unlist(str(meta["task_id"]))
                    report.unlisted += 1
                continue
            if status == TaskStatus.QUEUED.value and not meta.get("slots") and meta.get("tenant"):
                waiting_tenants.add(str(meta["tenant"]))
            swept = float(meta[SWEPT_AT]) if meta.get(SWEPT_AT) is not None else None
            quiet_since = max(float(meta.get("lease_expires") or 0), float(meta.get("updated_at") or 0),
                              float(meta.get("heartbeat_at") or 0), float(meta.get(SILENT_UNTIL) or 0),
                              swept or 0)  # fmt: skip
            if now - quiet_since >= stale_after:
                stranded[str(meta["task_id"])] = swept
    slots = store.slots.with_default(default_max_running, fleet_capacity, tier_limits=tier_limits)
    # Read before waking: a waiter woken below is parked as far as this pass is concerned (it
    # has its message now), so it is not also swept.
    lists = [
        pk for t in sorted(waiting_tenants) for pk in (keys.tenant_pk(t), *(tier_pk(t, i) for i in slots.tier_limits))
    ]
    parked = {pk: slots.parked(pk) for pk in lists}
    # The fleet's lists, when it has one (a capacity removed leaves its waiters to be swept).
    in_fleet = (
        {t: slots.parked(fleet_slots.queue_pk(t, slots.fleet_name)) for t in sorted(waiting_tenants)}
        if fleet_capacity
        else {}
    )
    for tenant, waiting in in_fleet.items():
        if waiting:  # a lost mark (a crash in park or in a wake) would hide them from every wake
            slots.mark_waiting(tenant)
    _wake_where_room(slots, queues, parked, report)
    _wake_fleet_room(slots, queues, sum(len(w) for w in in_fleet.values()), report)
    parked |= {fleet_slots.queue_pk(t, slots.fleet_name): waiting for t, waiting in in_fleet.items()}
    for task in _readable(store, list(stranded)):
        if task.status.value not in STRANDABLE:
            continue
        if task.status is TaskStatus.QUEUED and not task.slots and _is_parked(slots, task, parked):
            report.parked += 1
            continue
        if not store.tasks.mark_swept(task.task_id, now, after=stranded[task.task_id]):
            continue  # another sweep re-enqueued it since this one listed it
        queues.send(task.task_id, task.submission.priority, kind="swept", tenant=task.tenant)
        report.swept.append(task.task_id)
        log.warning("task %s swept: %s with no sign of life for over %.0fs; re-enqueued", task.task_id, task.status.value,
                    stale_after)  # fmt: skip
    for task in _readable(store, list(lost_looks)):
        if task.status is not TaskStatus.WAITING:
            continue
        # Its due moves to now first (the look sent is due at once), from the overdue due listed
        # (a look that moved it since is on its way): the next sweep sends no second look while
        # this one is, and of two sweeps at once only one sends.
        if not store.tasks.next_look(task.task_id, time.time(), after=lost_looks[task.task_id]):
            continue
        kind: MessageKind = "batch_poll" if task.batch else "remote_poll"
        on = "its batch" if task.batch else "a remote agent"
        queues.send(task.task_id, task.submission.priority, kind=kind, tenant=task.tenant)
        report.looked.append(task.task_id)
        log.warning("task %s waiting on %s: its look was due over %.0fs ago and never came; sent one",
                    task.task_id, on, stale_after)  # fmt: skip
    report.released = _release_blocked(store, queues, blocked, now=now, stale_after=stale_after)
    fair = FairShare(store, queues, default_limit=default_max_running, fleet_capacity=fleet_capacity,
                     tier_limits=tier_limits)  # fmt: skip
    report.given_back = _give_back_parked(fair, holding)
    observe.record_swept(len(report.swept) + len(report.looked) + len(report.released) + len(report.given_back))
    return report


def _release_blocked(
    store: Storage, queues: TaskQueues, task_ids: list[str], *, now: float, stale_after: float
) -> list[str]:
    """Move on each blocked task of ``task_ids`` that has a dependency ended (or gone) at least
    ``stale_after`` ago: its walk had that long, and was cut short. Through ``resolve``, the one
    place a blocked task moves (and its ending, ``task_ended``, goes on down the chain). A
    dependency that ended just now is left to its ender's walk, which is under way. One task
    whose move fails is logged and left for the next sweep; the others are moved."""
    tasks = [t for t in _readable(store, task_ids) if t.status is TaskStatus.BLOCKED]
    wanted = sorted({d for t in tasks for d in t.submission.depends_on})
    ended: dict[str, float] = dict.fromkeys(wanted, 0.0)  # dependency -> when it ended; gone: long ago
    for start in range(0, len(wanted), BATCH):
        for meta in store.tasks.metas(wanted[start : start + BATCH]):
            if meta.get("status") in ENDED:
                ended[str(meta["task_id"])] = float(meta.get("finished_at") or meta.get("updated_at") or 0)
            else:
                del ended[str(meta["task_id"])]  # still to run or running: its own end walks on
    released = []
    for task in tasks:
        over = [d for d in task.submission.depends_on if d in ended and now - ended[d] >= stale_after]
        if not over:
            continue
        try:
            moved = resolve(store, queues, task.task_id)
        except Exception:
            log.warning("task %s: could not move it on past its ended dependencies", task.task_id, exc_info=True)
            continue
        if moved is not None:
            released.append(task.task_id)
            log.warning("task %s was blocked %.0fs past the end of dependency %s, which no walk reported: %s",
                        task.task_id, stale_after, over[0], moved.value)  # fmt: skip
    return released


def _give_back_parked(fair: FairShare, task_ids: list[str]) -> list[str]:
    """Give back the slots each parked task of ``task_ids`` still names (see the module): those
    that freed some. One whose release fails is logged and left for the next sweep."""
    given_back = []
    for task_id in task_ids:
        try:
            freed = fair.release(task_id)
        except Exception:
            log.warning("task %s: could not give back the slots it holds parked", task_id, exc_info=True)
            continue
        if freed:
            given_back.append(task_id)
            log.warning("task %s was parked holding slots %s with no release to come: given back",
                        task_id, ", ".join(freed))  # fmt: skip
    return given_back


def _is_parked(slots: RunningSlots, task: Task, parked: dict[str, set[str]]) -> bool:
    """Does ``task`` have a WAIT item (its tenant's list, its tier's, the fleet's, or its concurrency key's)?"""
    pks = [keys.tenant_pk(task.tenant)]
    if tier_pk(task.tenant, task.submission.priority) in parked:  # its tier's list (read only with a tier limit)
        pks.append(tier_pk(task.tenant, task.submission.priority))
    if fleet_slots.queue_pk(task.tenant, slots.fleet_name) in parked:  # the fleet's list (read only with a fleet)
        pks.append(fleet_slots.queue_pk(task.tenant, slots.fleet_name))
    if task.submission.concurrency is not None:
        pks.append(key_pk(task.tenant, task.submission.concurrency.key))
    for pk in pks:
        if pk not in parked:
            parked[pk] = slots.parked(pk)
        if task.task_id in parked[pk]:
            return True
    return False


def _wake_where_room(slots: RunningSlots, queues: TaskQueues, parked: dict[str, set[str]], report: SweepReport) -> None:
    """Wake, for each tenant with waiters, as many as its slot has room for now. A release
    wakes one waiter per slot it freed, so room that no release made (a raised default) would
    otherwise stay idle while its waiters wait."""
    for pk, waiting in parked.items():
        if not waiting:
            continue
        room = None if is_tier_pk(pk) else slots.room(pk.removeprefix("TENANT#"))  # a tier's: next_waiters counts it
        most = len(waiting) if room is None else min(room, len(waiting))
        if most <= 0:
            continue
        for waiter, tier, tenant in slots.next_waiters(pk, most=most):
            queues.send(waiter, tier, tenant=tenant or pk.removeprefix("TENANT#"))
            report.woken.append(waiter)
            log.info("task %s woken by the sweeper: its tenant's slot has room", waiter)


def _wake_fleet_room(slots: RunningSlots, queues: TaskQueues, waiting: int, report: SweepReport) -> None:
    """Wake as many of the fleet's waiters as it has room for now (by weight, as a release
    does): room no release made (a raised capacity) would otherwise stay idle."""
    if waiting <= 0:
        return
    for waiter, tier, tenant, _ in slots.next_fleet_waiters(waiting):
        queues.send(waiter, tier, tenant=tenant or None)
        report.woken.append(waiter)
        log.info("task %s woken by the sweeper: the fleet has room", waiter)


def _readable(store: Storage, task_ids: list[str]) -> list[Task]:
    """The tasks of ``task_ids`` that can be read. One stored as no code of ours reads it is left
    out with a warning (its own message dead-letters it, ``dispatch._poison``): before, it failed
    the whole pass, every pass, and no other task was swept or looked after."""
    found = read_tasks(store, task_ids)
    for task_id in (t for t, task in found.items() if task is None):
        log.warning("task %s cannot be read (gone, or stored as nothing here reads): not swept", task_id)
    return [task for task in found.values() if task is not None]
