"""The workspace of a task as of a committed step: its manifest and how to read its content.
Read by the API's files routes (``control/files.py``) and by the A2A artifacts that list a
finished task's files (``queueing/a2a_artifacts.py``, which the worker's push notifications read
too, so it lives below both).

The state of step N is the manifest of the last tools step at or before N that changed the
workspace (a step records a manifest only when its turn changed the files), or the starting
files when none did: the same rule a fork from step N follows (``storage.tasks.fork``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentq.core.errors import TaskNotFound, ValidationError
from agentq.core.models import Task, ToolsStep
from agentq.core.workspace import EMPTY, Manifest, has_workspace, lookup_of, stored_start
from agentq.storage.container import Storage


class NoWorkspace(TaskNotFound):
    """The task has no workspace (neither starting files nor a workspace tool): no files to list."""

    code = "workspace_not_found"


@dataclass(frozen=True)
class State:
    """The workspace as a committed step left it, and how to read its content."""

    step: int
    manifest: Manifest
    digest: str | None  # the manifest's hash in the bucket; None: the submission's starting files
    read: Callable[[str], bytes]


def state_at(store: Storage, task: Task, step: int | None, *, field: str = "step") -> State:
    """The workspace as of committed step ``step`` (default: the last one)."""
    sub = task.submission
    if not has_workspace(sub.workspace, sub.constraints.tools):
        raise NoWorkspace(f"task {task.task_id} has no workspace", field="task_id")
    latest = task.step
    number = latest if step is None else step
    if not 0 <= number <= latest:
        raise ValidationError(f"{field}: {number} is not a committed step of the task (0 to {latest})", field=field)
    if number == latest:
        ref = task.workspace
    else:
        refs = [
            r.body.workspace
            for r in store.steps.load(task.task_id, upto=number)
            if isinstance(r.body, ToolsStep) and r.body.workspace is not None
        ]
        ref = refs[-1] if refs else task.workspace_start
    start = stored_start(sub.workspace, task.tenant)
    digest = ref.manifest if ref is not None else start.manifest if start is not None else None
    if digest is None:
        manifest, seed = sub.workspace.seed() if sub.workspace is not None else (EMPTY, {})
        return State(number, manifest, None, seed.__getitem__)
    task_id, lookup = task.task_id, lookup_of(sub.workspace, task.tenant)
    manifest = Manifest.from_bytes(store.workspaces.get_manifest(task_id, digest, lookup))
    return State(number, manifest, digest, lambda blob: store.workspaces.get_blob(task_id, blob, lookup))
