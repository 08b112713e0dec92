"""Ending a task and everything under it: a cancel's tree (``control.operations.cancel``), and a
sub-agent its parent's fan-out gave up on at its deadline (``time_out_subagent``, which the
engine's spawn turn calls through ``core.ports.SubtreeTimeout``, handed in by
``agentq.runtime.build_engine``: the core imports no control).

One walk for both, ``end_tree``: the fan-out executions under the task stopped, every task of
the tree not ended yet moved (never-started ones first), the tree read again until no task is
new, the slots of those ended ``queued`` given back, the holds of those ended with a call out
kept counted, every budget folded into its parent's, leaves first, and each one's ending
(``queueing.endings.task_ended``). A sub-agent timed out with only its own move left its own
sub-agents running on, holding its budget open for good: the parent then folded their whole
shares into the root as spent and unknown, and the root's next call waited on that unknown.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentq.core.engine import count_as_spent, count_batch_hold_as_spent, spend_lapsed
from agentq.core.engine.conversation import conversation, final_text
from agentq.core.errors import IllegalTransition
from agentq.core.fanout import SUBAGENT_DEADLINE
from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch import delay_seconds
from agentq.queueing.endings import task_ended
from agentq.queueing.queues import TaskQueues
from agentq.storage import fleet_slots
from agentq.storage.container import Storage
from agentq.storage.running_slots import RunningSlots
from agentq.storage.table import TransactionConflict

log = logging.getLogger("agentq.control")


@dataclass(frozen=True)
class Ending:
    """How a task of an ended tree ends: its status and its error (whose message is also the
    cause a stopped fan-out execution is given)."""

    status: TaskStatus
    error: dict[str, Any]


def subtree(store: Storage, task: Task) -> list[Task]:
    """The task and every descendant, parents before children (from the SPAWN records)."""
    order = [task]
    i = 0
    while i < len(order):
        ids = [child for spawn in store.spawns.list(order[i].task_id) for child in spawn.children]
        order += store.tasks.get_many(ids)
        i += 1
    return order


def time_out_subagent(
    store: Storage,
    child: Task,
    *,
    fanout: Any = None,
    queues: TaskQueues | None = None,
    slots: RunningSlots | None = None,
) -> bool:
    """End ``child``, a sub-agent whose parent's fan-out gave up on it (its deadline passed),
    ``timed_out`` with its partial result, and everything under it ``cancelled``
    (``ancestor_timed_out``, naming it: their own deadlines may not have passed, but no one
    waits for them any more). True when ``child`` itself was moved; False when it ended by
    itself first (its parent then reads how it ended). The parent's run folds ``child``'s
    budget into its own afterwards, fenced; everything under it is folded here."""
    top = Ending(TaskStatus.TIMED_OUT, {"code": "timeout", "message": SUBAGENT_DEADLINE})
    below = Ending(
        TaskStatus.CANCELLED,
        {"code": "ancestor_timed_out", "message": f"sub-agent {child.task_id}, which it worked for, timed out"},
    )
    return child.task_id in end_tree(store, child, top, below, fanout=fanout, queues=queues, slots=slots)


def end_tree(
    store: Storage,
    task: Task,
    top: Ending,
    below: Ending,
    *,
    fanout: Any = None,
    queues: TaskQueues | None = None,
    slots: RunningSlots | None = None,
    fenced: Mapping[str, Task] | None = None,
) -> list[str]:
    """End ``task`` as ``top`` and every task under it as ``below``; the ids of those this call
    ended (a task that ended by itself first is not among them). See ``operations.cancel`` for
    what each step is for; ``fenced``: tasks the caller moved already (a stop's)."""
    fenced = fenced or {}
    tree = [fenced.get(node.task_id, node) for node in subtree(store, task)]
    ended: list[str] = []
    fresh = tree
    while fresh:  # a round: the tasks the last read found that no round had seen
        _end_round(store, task.task_id, fresh, top, below, fanout, fenced, ended)
        # A running task of the tree may have spawned between the read and its move: its children
        # (queued, or already started by its fan-out) are read again and ended in turn, until a
        # read finds no task not seen. This ends: a task spawns only by fenced writes (the SPAWN
        # record, its children), which its move refuses, so once a round has moved (or found ended)
        # every task it read, their children are final, and the next read can only find tasks below
        # those the last round was the first to see: each round reaches one level deeper than the
        # one before, and the tree is at most ``max_depth`` deep.
        seen = {node.task_id for node in tree}
        fresh = [fenced.get(node.task_id, node) for node in subtree(store, task) if node.task_id not in seen]
        tree += fresh
    # The slots of the tasks ended queued go back first, before anything that may raise (a
    # budget that keeps changing under settle_child, a dependent's look): nothing else would
    # give them back (``operations.cancel``), so task_ended below is told not to.
    for node in tree:
        if node.task_id in ended and node.status is TaskStatus.QUEUED:
            _give_back_slots(slots or store.slots, queues, node)
    for node in tree:  # a fenced task was read after its mark, when no hold could be taken any more
        held = node.inflight is not None or node.batch is not None or bool(node.lapsed_holds)
        if node.task_id in ended and (held or node.task_id not in fenced):
            _keep_hold_counted(store, queues, node)
    for node in reversed(tree[1:]):  # leaves first: a child's spend reaches its parent, then the root
        if node.parent_id:
            store.budgets.settle_child(node.parent_id, node.task_id)
    # Each one's ending, its slots already back: its callback; what waited for it is cancelled
    # too (dependency_failed). A fan-out parent learns of a child's end from the child's own
    # message (its token is the dispatcher's to use).
    for node in tree:
        if node.task_id in ended:
            task_ended(store, queues, node, (top if node.task_id == task.task_id else below).status)
    return ended


def _end_round(
    store: Storage,
    top_id: str,
    nodes: list[Task],
    top: Ending,
    below: Ending,
    fanout: Any,
    fenced: Mapping[str, Task],
    ended: list[str],
) -> None:
    """End ``nodes`` (tasks of the tree, in tree order; ``top_id``: the tree's own), adding
    those moved to ``ended``.

    No new child may start while the tree is being ended: the fan-out executions are stopped
    first, then the children that never ran are ended (nothing to read for them), then the
    ones that did. Ending a running child first would let its fan-out start the next one (its
    slot freed) before the loop reached that one."""
    if fanout is not None:
        for node in nodes:
            for spawn in store.spawns.list(node.task_id):
                if spawn.execution_arn:
                    fanout.stop(spawn.execution_arn, str(top.error.get("message", "")))
    for node in sorted(nodes, key=lambda n: n.claim_count > 0):  # stable: never-started first, in tree order
        if node.task_id in fenced:
            ended.append(node.task_id)
            continue
        if node.status.terminal:
            continue
        ending = top if node.task_id == top_id else below
        partial = node.result or final_text(conversation(node.submission.goal, store.steps.load(node.task_id)))
        try:
            store.tasks.transition(node.task_id, ending.status, result=partial, error=ending.error)
            ended.append(node.task_id)
        except IllegalTransition:
            pass  # it finished meanwhile: a child is skipped; the tree's own is the caller's to say


def _keep_hold_counted(store: Storage, queues: TaskQueues | None, task: Task) -> None:
    """A task cancelled (or timed out with its tree) with a call's hold on it (its worker's call in flight, or answered
    and not yet committed, or a batch it waits on; or a dead worker's): the call may have been
    billed, so the hold stays counted (ARCHITECTURE 4), set aside as a successor would set it
    aside: its worker, alive, settles it to the call's usage (or gives it back, the call never
    sent); else it is counted as spent (unknown) at its deadline, by the ``release_holds``
    message sent for then. Left as it was, no one claims a cancelled task: ``reserved`` kept
    the hold for good and the call's possible spend was never counted. The task is read again
    now that no worker of it can take another (its reservations are fenced), so a hold taken
    between the tree's read and the cancel is seen too, and each write is conditioned on the
    hold's ticket, so one settled meanwhile changes nothing. (A stop's fenced task holding
    nothing and waiting on no batch at its read is not read again: the read came after its
    mark, which fences holds too, and costs a stop no read.) A batch it waits on keeps its
    windows' hold counted too (``_keep_batch_hold_counted``). The holds older epochs left set
    aside (``lapsed_<epoch>``: a dead worker's call, on a task taken over since) go the same
    way (``_spend_lapsed_holds``)."""
    task = store.tasks.get(task.task_id)
    _keep_batch_hold_counted(store, task)
    until = _spend_lapsed_holds(store, task)
    task_id, held = task.task_id, task.inflight
    if held is not None:
        held = held.with_seen(task.seen)
        if held.lapsed_by(time.time()):
            count_as_spent(store.budgets, task, held)
        elif store.budgets.set_aside_at_end(task_id, held) and held.until is not None:
            until = max(until or 0.0, held.until)
    if until is not None and queues is not None:
        wait = delay_seconds(until - time.time())
        queues.send(task_id, task.submission.priority, kind="release_holds", delay_seconds=wait, tenant=task.tenant)


def _spend_lapsed_holds(store: Storage, task: Task) -> float | None:
    """The cancelled task's holds set aside by older epochs' successors: those whose calls can
    no longer complete counted as spent now, and the deadline of the last one still live (None:
    none is), for the ``release_holds`` message that counts the rest then. A task cancelled
    ``idle`` holds them with no run to come: an interrupt left it so after a claim took over
    from a dead worker, and a cancel left them in ``reserved`` for good
    (``tests/test_cancel_holds.py``, ``tests/test_idle_holds.py``)."""
    if not task.lapsed_holds:
        return None
    now = time.time()
    live = spend_lapsed(store.budgets, task).live
    return now + max(live) if live else None


def _keep_batch_hold_counted(store: Storage, task: Task) -> None:
    """A task cancelled while its turn's batch is out (read after the move, when no worker of it
    can commit its answer any more): the batch runs and is billed, and no run will read it, so
    the hold its call kept on the tenant's hour and the scopes' caps since it was sent is counted
    as spent (unknown), once: only if this cancel takes its settling (a worker that met the
    batch's outcome first settled it). It used to be given back at the park, so a user could
    send a batch, cancel, and repeat, each billed and counted on no window."""
    batch = task.batch
    if batch is None or int(batch["step"]) != task.step + 1:  # not the turn it waits on
        return
    if store.tasks.take_batch_hold_at_end(task.task_id, str(batch["id"])):
        count_batch_hold_as_spent(store.windows, store.caps, batch)


def _give_back_slots(slots: RunningSlots, queues: TaskQueues | None, node: Task) -> None:
    """Release the slots of ``node``, cancelled ``queued``, unless a worker claimed it between the
    read and the cancel (it gives them back at the end of the step it runs); wake a waiter for
    each slot freed (without queues, or a fleet capacity unknown here, the sweeper wakes that
    room). Idempotent with the release its message's delivery makes."""
    try:
        freed = slots.release(node.task_id, if_epoch=node.lease_epoch)
    except TransactionConflict:  # hot slot items, past the retries: its message (if any) releases
        log.warning("task %s: cancelled, but its slots could not be given back now", node.task_id)
        return
    if queues is None:
        return
    for pk in freed:
        if not fleet_slots.is_shard(pk):
            woken = slots.next_waiters(pk, if_limited=True)
        elif slots.fleet_capacity is not None:
            woken = [(task_id, tier, tenant) for task_id, tier, tenant, _ in slots.next_fleet_waiters(1)]
        else:
            continue
        for task_id, tier, tenant in woken:
            queues.send(task_id, tier, tenant=tenant or None)
            log.info("task %s woken: the cancel of %s freed a slot of %s", task_id, node.task_id, pk)
