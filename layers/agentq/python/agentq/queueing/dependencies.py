"""Task dependencies: a task that names ``depends_on`` waits in ``blocked`` (no message, no
compute) until every task it names has succeeded, then it is enqueued; one that fails, is
cancelled, runs out of budget or time cancels it with ``dependency_failed``, and so on down.

Who looks: the submitter, right after writing the task and its edges (``DEPENDENT#`` items in
each dependency's partition), and whoever ends a task (the dispatcher, a cancel), after
writing its status, for each of its dependents. Each writes first and reads second, so at
least one of them sees the other's write: a dependency that ends while the dependent is being
created is never missed. Both may see it; the move out of ``blocked`` is a conditional write,
so the task is enqueued (or cancelled) once. Cycles cannot happen: a task can only depend on
tasks that exist before it.
"""

from __future__ import annotations

import contextlib
import logging

from agentq.core.errors import IllegalTransition, ValidationError
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.queueing.queues import TaskQueues
from agentq.queueing.webhooks import enqueue_end
from agentq.storage.container import Storage

log = logging.getLogger("agentq.dependencies")


def check_dependencies(store: Storage, submission: TaskSubmission, *, tenant: str) -> None:
    """Every task named exists and is the tenant's own (a foreign one reads as unknown)."""
    found = {t.task_id: t for t in store.tasks.get_many(submission.depends_on)} if submission.depends_on else {}
    for i, task_id in enumerate(submission.depends_on):
        dep = found.get(task_id)
        if dep is None or dep.tenant != tenant:
            raise ValidationError(f"depends_on[{i}]: no task {task_id!r}", field=f"depends_on[{i}]")


def resolve(store: Storage, queues: TaskQueues | None, task_id: str) -> TaskStatus | None:
    """Move a blocked task on if its dependencies allow: ``queued`` (and enqueued) when all
    succeeded, ``cancelled`` when one cannot; None while it must wait (or is not blocked)."""
    task = store.tasks.get(task_id)
    if task.status is not TaskStatus.BLOCKED:
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
                return None  # another look moved it first
            log.info("task %s cancelled: dependency %s ended %s", task_id, dep_id, ended)
            enqueue_end(queues, task, TaskStatus.CANCELLED)
            release_dependents(store, queues, task_id)
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


def release_dependents(store: Storage, queues: TaskQueues | None, task_id: str) -> None:
    """``task_id`` ended: look at every task waiting for it."""
    for dependent in store.tasks.dependents(task_id):
        with contextlib.suppress(IllegalTransition):
            resolve(store, queues, dependent)
