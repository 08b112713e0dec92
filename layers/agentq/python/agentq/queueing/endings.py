"""A task's ending, in one place: ``task_ended``.

When a task ends (succeeded, failed, cancelled, cost_exceeded, timed_out, failed_outcome: by its run, by the
dispatcher failing it on its last attempt, by a concurrency key's ``skip``, by a cancel, by a
dependency that failed, or by the report of a message for a task that already ended) five
things follow, in this order:

1. its slots go back (``give_back``: the running slots it held, and a waiter woken for each);
2. its fan-out parent is told, through the task's Step Functions callback token (``fanout``);
3. its callback is posted, if its submission asked for one (``queueing.webhooks``);
4. a task its alias sampled for online evaluation has its counts made in its version's quality
   bucket (one read of META, only for a sampled task): the grade counts its run could not make
   (META's grade's ``uncounted``: the bucket kept busy past the retries, ``core.engine._online``),
   and, ended without an answer (failed, timed_out, cost_exceeded, cancelled, after a run of its
   version began), the task itself as ``unanswered`` (``core.quality.unanswered_tally``). Each
   once (its marker: ``ONLINE#<step>``, ``ONLINE#end``), so a redelivery's report of the same end
   counts nothing more. A count that fails is logged and left: a grade's stays on META for the
   next report of an end of the task (a redelivery, a later end) to make;
5. the tasks that depend on it are looked at (``depends_on``): each moves on, queued when
   every dependency succeeded, cancelled (``dependency_failed``) when one cannot, which is an
   ending too, so this goes on down the chain: walked with a worklist (``release_dependents``),
   not by recursion, so a chain of any length is cancelled to its end (by recursion, a chain of
   a few hundred links raised RecursionError part way and left the rest ``blocked`` for good).

Who ends a task decides which of the first two apply: the dispatcher gives back what the run's
gate took and knows the parent's token; a task skipped at its submission, or cancelled for a
dependency, holds no slot and has no parent waiting yet. A cancel (``control.subtrees``)
gives back the slots of the tasks it cancelled ``queued`` itself, on their own epoch's
condition, for its whole tree before it folds the children's budgets or calls this function:
either may raise (``settle_child`` gives up on a budget that keeps changing; a dependent's look
may fail), and nothing else would give those slots back (a task the fleet's waker could not
send has no message, and the sweeper never lists an ended task). So it passes no
``give_back``, and leaves the parent to the child's own message.

Every ending goes through this function but one, which a new consequence must look at too: a
task whose stored items no longer validate (``queueing.dispatch._poison.unreadable_task``) is
failed, its slots given back and its parent told by the dispatcher itself: there is no task to
read for a callback or its dependents. (A child whose parent's fan-out gave up waiting,
``core.engine._spawn``, is ended ``timed_out`` with its subtree by
``control.subtrees.time_out_subagent``, handed to the engine by ``runtime.build_engine``, which
calls this function as a cancel does; an engine built without it, a test's, moves the child
alone, and its consequences follow when a message of the child's finds it ended,
``dispatch._ended.answer_ended``.)

Dependencies (moved here because ending a task is what releases them, and a dependent that
cannot run ends too): who looks is the submitter, right after writing the task and its edges
(``DEPENDENT#`` items in each dependency's partition, ``queueing.dependencies``), and whoever
ends a task, after writing its status. Each writes first and reads second, so at least one of
them sees the other's write: a dependency that ends while the dependent is being created is
never missed. Both may see it; the move out of ``blocked`` is a conditional write, so the task
is enqueued (or cancelled) once. Cycles cannot happen: a task can only depend on tasks that
exist before it.

A walk cut short (the ender killed, a read that failed) leaves dependents ``blocked``, and a
blocked task has no message of its own. So a walk goes on through a dependent already cancelled
``dependency_failed`` as through one it cancels itself, and two things finish the cascade: the
next report of the end (its redelivered message, ``dispatch._ended``), for an ender that has a
message; and, for one that has none (a cancel of a blocked or queued task, answered 5xx, whose
second try is a 409), the sweeper, which moves on (``resolve``) a blocked task quiet for its
``stale_after`` with a dependency ended as long ago (``queueing.sweeper``). Each task's
dependents are listed once per walk (a diamond is walked once).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from agentq.core.errors import IllegalTransition, TaskNotFound
from agentq.core.fanout import FanoutLauncher
from agentq.core.models import Task, TaskStatus
from agentq.core.quality import GradeTally, unanswered_tally
from agentq.queueing.a2a_push import enqueue_push
from agentq.queueing.queues import TaskQueues
from agentq.queueing.webhooks import enqueue_end
from agentq.storage.container import Storage

log = logging.getLogger("agentq.endings")


def task_ended(
    store: Storage,
    queues: TaskQueues | None,
    task: Task,
    status: TaskStatus,
    *,
    fanout: FanoutLauncher | None = None,
    give_back: Callable[[], object] | None = None,
    walk: list[str] | None = None,
) -> None:
    """``task`` ended ``status``: give back its slots (``give_back``, when it may hold some),
    tell its fan-out parent (when ``fanout`` is given and the task has a callback token), post
    its callback, count a sampled task's end without an answer, release its dependents. A
    callback that cannot be queued, or a count that cannot be made, never holds up the rest.

    ``walk``: a dependency walk under way (``release_dependents``) that cancelled this task;
    its dependents are left on the walk's worklist instead of walked here, so a long chain
    never nests one call per link."""
    if give_back is not None:
        give_back()
    if fanout is not None:
        token = task.task_token or store.tasks.get(task.task_id).task_token
        if token:
            fanout.child_finished(token, task.task_id, status)
    try:
        enqueue_end(store, queues, task, status)
    except Exception:
        log.warning("could not queue the callback of task %s", task.task_id, exc_info=True)
    try:
        enqueue_push(store, queues, task, status)  # the push configs of a task of an agent (queueing/a2a_push.py)
    except Exception:
        log.warning("could not queue the push notifications of task %s", task.task_id, exc_info=True)
    if task.submission.online is not None:
        try:
            count_online(store, task.task_id)
        except Exception:  # a count is an observation: it never holds up the rest
            log.warning("could not read sampled task %s to count its end", task.task_id, exc_info=True)
    if walk is not None:
        walk.append(task.task_id)
    else:
        release_dependents(store, queues, task.task_id)


def count_online(store: Storage, task_id: str) -> None:
    """A sampled task ended: the counts its grades left (``uncounted``), then, without an answer,
    the task, in its version's bucket, each once. Read again (the caller's copy may be the
    claim's, before the run that ended it): its grade, what it spent, its version (a move changes
    it), whether a run of it began, and whether it is still ended. Each count is tried on its
    own: one that fails is logged, and the others are made."""
    task = store.tasks.get(task_id)
    left = [GradeTally.from_meta(raw) for raw in (task.grade or {}).get("uncounted", [])]
    ended = unanswered_tally(task)
    for tally in [*left, *([ended] if ended is not None else [])]:
        try:
            if not store.quality.count(tally):
                log.debug("task %s: online count of step %s made before", task_id, tally.step)
        except Exception:
            log.warning(
                "could not count sampled task %s (step %s, version %s, hour %s) in its version's quality",
                task_id, tally.step, tally.version, tally.hour, exc_info=True,
            )  # fmt: skip


def release_dependents(store: Storage, queues: TaskQueues | None, task_id: str) -> None:
    """``task_id`` ended: look at every task waiting for it, and down the chain, with a
    worklist: a dependent this look cancels, or one already cancelled ``dependency_failed``
    (a cascade an earlier look began and did not finish), has its own dependents looked at in
    turn. Each task's dependents are listed once."""
    pending, listed = [task_id], set[str]()
    while pending:
        ended = pending.pop()
        if ended in listed:
            continue
        listed.add(ended)
        for dependent in store.tasks.dependents(ended):
            # TaskNotFound: a dependent whose submission was undone (its enqueue failed) since
            # this walk listed its edge (both go in one transaction): nothing waits there.
            with contextlib.suppress(IllegalTransition, TaskNotFound):
                resolve(store, queues, dependent, walk=pending)


def resolve(
    store: Storage, queues: TaskQueues | None, task_id: str, *, walk: list[str] | None = None
) -> TaskStatus | None:
    """Move a blocked task on if its dependencies allow: ``queued`` (and enqueued) when all
    succeeded, ``cancelled`` (an ending: ``task_ended``) when one cannot; None while it must
    wait (or is not blocked). Within a walk (``walk``, ``release_dependents``'s worklist), a
    task it cancels, or finds cancelled ``dependency_failed`` already, is put on the worklist
    for its dependents to be looked at."""
    task = store.tasks.get(task_id)
    if task.status is not TaskStatus.BLOCKED:
        if walk is not None and _cancelled_for_a_dependency(task):
            walk.append(task_id)  # a cascade cut short: finish it below this task
        return None
    deps = {d.task_id: d for d in store.tasks.get_many(task.submission.depends_on)}
    for dep_id in task.submission.depends_on:
        dep = deps.get(dep_id)
        if dep is None or (dep.status.terminal and dep.status is not TaskStatus.SUCCEEDED):
            ended = dep.status.value if dep is not None else "deleted"
            error = {"code": "dependency_failed", "message": f"dependency {dep_id} ended {ended}", "dependency": dep_id}
            try:
                store.tasks.transition(task_id, TaskStatus.CANCELLED, error=error)
            except IllegalTransition:
                return None  # another look moved it first (and walks on from it)
            log.info("task %s cancelled: dependency %s ended %s", task_id, dep_id, ended)
            task_ended(store, queues, task, TaskStatus.CANCELLED, walk=walk)
            return TaskStatus.CANCELLED
    if all(deps[d].status is TaskStatus.SUCCEEDED for d in task.submission.depends_on):
        try:
            store.tasks.transition(task_id, TaskStatus.QUEUED)
        except IllegalTransition:
            return None
        if queues is not None:
            queues.send(task_id, task.submission.priority, tenant=task.tenant)
        log.info("task %s unblocked: its %d dependencies succeeded", task_id, len(deps))
        return TaskStatus.QUEUED
    return None


def _cancelled_for_a_dependency(task: Task) -> bool:
    return task.status is TaskStatus.CANCELLED and (task.error or {}).get("code") == "dependency_failed"
