"""Reading tasks in a pass over many of them (a DLQ listing or redrive, the sweeper's pass),
where one task stored as no code of ours can read it (``DETERMINISTIC_FAULTS``: written by hand,
by a release that wrote what this one refuses) must not fail the pass for every other task."""

from __future__ import annotations

from agentq.core.errors import DETERMINISTIC_FAULTS, TaskNotFound
from agentq.core.models import Task
from agentq.storage.container import Storage


def read_tasks(store: Storage, task_ids: list[str]) -> dict[str, Task | None]:
    """Many tasks in one read (BatchGetItem); None for one gone or unreadable. When one of them
    is unreadable the read fails as a whole, and each is read alone, so only that one is None."""
    if not task_ids:
        return {}
    try:
        found = {task.task_id: task for task in store.tasks.get_many(task_ids)}
    except DETERMINISTIC_FAULTS:
        return {task_id: task_or_none(store, task_id) for task_id in task_ids}
    return {task_id: found.get(task_id) for task_id in task_ids}


def task_or_none(store: Storage, task_id: str) -> Task | None:
    """The task, or None when it is gone or unreadable (stored as no code of ours can read it:
    ``DETERMINISTIC_FAULTS``, as ``dispatch._poison.unreadable_task`` dead-lettered it). Such a
    task's dead letter is nobody's: no tenant lists or redrives it, and one of them in a DLQ
    every tenant shares must not break another tenant's listing or redrive; an operator sees and
    moves it with ``agentq dlq``."""
    try:
        return store.tasks.get(task_id)
    except TaskNotFound:
        return None
    except DETERMINISTIC_FAULTS:
        return None
