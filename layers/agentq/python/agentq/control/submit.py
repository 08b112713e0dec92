"""Turning a caller's request into a queued task, or into a precise error that wrote nothing."""

from __future__ import annotations

from typing import Any

import pydantic

from agentq.core.errors import ValidationError
from agentq.core.models import Task, TaskSubmission
from agentq.core.providers.scripted import load_script
from agentq.queueing.queues import TaskQueues
from agentq.storage.store import Store
from agentq.core.tools import ToolRegistry


def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + str(part)
    return path


def parse_submission(raw: Any) -> TaskSubmission:
    """Validate a submission; the error names the first bad field in dotted form."""
    if not isinstance(raw, dict):
        raise ValidationError("the submission must be a JSON object", field="body")
    try:
        return TaskSubmission.model_validate(raw)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith(("function-", "Script", "str"))))
        field = _field_path(loc)
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown field"
        # A model-level check names its field as "field: message" (pydantic gives no loc).
        head, sep, rest = message.partition(": ")
        if sep and head.isidentifier():
            field = ".".join(filter(None, [field, head]))
            message = rest
        field = field or "body"
        raise ValidationError(f"{field}: {message}", field=field) from None


def check_submission(submission: TaskSubmission, tools: ToolRegistry) -> None:
    """Checks that need the worker's world: known tools, a loadable script."""
    for i, name in enumerate(submission.constraints.tools):
        if tools.get(name) is None:
            raise ValidationError(
                f"constraints.tools[{i}]: unknown tool {name!r}; available: {', '.join(sorted(tools.names()))}",
                field=f"constraints.tools[{i}]",
            )
    if submission.script is not None:
        try:
            load_script(submission.script)
        except (ValueError, pydantic.ValidationError) as exc:
            raise ValidationError(f"script: {exc}", field="script") from None


def submit(store: Store, tools: ToolRegistry, raw: Any, *, tenant: str, queues: TaskQueues | None = None) -> Task:
    """Validate fully, create the task (META + root budget, one transaction), then enqueue it.

    If the enqueue fails the task is deleted again, so a caller who sees an error never
    leaves a queued task that no message will ever run.
    """
    submission = raw if isinstance(raw, TaskSubmission) else parse_submission(raw)
    check_submission(submission, tools)
    task = store.create_task(submission, tenant=tenant)
    if queues is not None:
        try:
            queues.send(task.task_id, submission.priority)
        except Exception:
            store.delete_unstarted(task.task_id)
            raise
    return task
