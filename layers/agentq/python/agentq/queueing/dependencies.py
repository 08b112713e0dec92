"""Task dependencies: a task that names ``depends_on`` waits in ``blocked`` (no message, no
compute) until every task it names has succeeded, then it is enqueued; one that fails, is
cancelled, runs out of budget or time cancels it with ``dependency_failed``, and so on down.

This module checks a submission's dependencies; moving a blocked task on is part of a task's
ending (``queueing.endings``: ``resolve``, ``release_dependents``), which the submitter also
calls right after writing the task and its edges.
"""

from __future__ import annotations

from agentq.core.errors import ValidationError
from agentq.core.models import TaskSubmission
from agentq.storage.container import Storage


def check_dependencies(
    store: Storage, submission: TaskSubmission, *, tenant: str, only_user: str | None = None
) -> None:
    """Every task named exists and is the tenant's own (a foreign one reads as unknown).
    ``only_user``: the caller acts as that end user (a token's): a task of another user (or of
    none) reads as unknown too, since its goal and result would reach the dependent's first
    message. A tenant key (None) may name any of its tenant's tasks."""
    found = {t.task_id: t for t in store.tasks.get_many(submission.depends_on)} if submission.depends_on else {}
    for i, task_id in enumerate(submission.depends_on):
        dep = found.get(task_id)
        if dep is None or dep.tenant != tenant or (only_user is not None and dep.user != only_user):
            raise ValidationError(f"depends_on[{i}]: no task {task_id!r}", field=f"depends_on[{i}]")
