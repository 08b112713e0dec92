"""Turning a caller's request into a queued task, or into a precise error that wrote nothing."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pydantic

from agentq.core.errors import ValidationError
from agentq.core.models import Task, TaskStatus, TaskSubmission
from agentq.core.pricing import load_price_table
from agentq.core.providers.scripted import load_script
from agentq.core.tools import ToolRegistry
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage


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
        loc = tuple(
            p for p in first["loc"] if not (isinstance(p, str) and p.startswith(("function-", "Script", "str")))
        )
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
    """Checks that need the worker's world: known tools, a loadable script, a priced model.

    A model the price table does not know would be charged $0 to the ledger: it is refused,
    unless the deployment prices it (``AGENTQ_PRICES``). The scripted provider spends nothing,
    so its model name is not checked.
    """
    if submission.provider != "scripted":
        prices = load_price_table()
        if prices.price_for(submission.model) is None:
            raise ValidationError(
                f"model: no price for {submission.model!r}, so its cost could not be counted; priced models: "
                f"{', '.join(sorted(prices.root))} (and their dated or Bedrock ids); price another with AGENTQ_PRICES",
                field="model",
            )
    for i, name in enumerate(submission.constraints.tools):
        if tools.get(name) is None:
            raise ValidationError(
                f"constraints.tools[{i}]: unknown tool {name!r}; available: {', '.join(sorted(tools.names()))}",
                field=f"constraints.tools[{i}]",
            )
    for name in submission.constraints.tool_policies:
        if name not in submission.constraints.tools:
            raise ValidationError(
                f"constraints.tool_policies.{name}: a policy for a tool the task may not use; "
                f"its tools: {', '.join(submission.constraints.tools) or '(none)'}",
                field=f"constraints.tool_policies.{name}",
            )
    if submission.script is not None:
        try:
            load_script(submission.script)
        except (ValueError, pydantic.ValidationError) as exc:
            raise ValidationError(f"script: {exc}", field="script") from None


def submit(store: Storage, tools: ToolRegistry, raw: Any, *, tenant: str, queues: TaskQueues | None = None) -> Task:
    """Validate fully, create the task (META with its budget, and the submission: one transaction), then enqueue it.

    If the enqueue fails the task is deleted again, so a caller who sees an error never
    leaves a queued task that no message will ever run.
    """
    return submit_once(store, tools, raw, tenant=tenant, queues=queues).task


@dataclass(frozen=True)
class Submitted:
    task: Task
    created: bool  # False: an earlier request with the same idempotency key created it


def request_hash(submission: TaskSubmission) -> str:
    """What an idempotency key is bound to: the request as sent (before deployment defaults
    fill it in), so a retry matches even if the defaults changed in between."""
    return hashlib.sha256(submission.model_dump_json(exclude_none=True).encode()).hexdigest()


def submit_once(
    store: Storage,
    tools: ToolRegistry,
    raw: Any,
    *,
    tenant: str,
    queues: TaskQueues | None = None,
    idempotency_key: str | None = None,
    digest: str | None = None,
) -> Submitted:
    """``submit`` with an optional idempotency key: the same key and request return the task
    the first one created (``created=False``); the same key with another request raises
    IdempotencyConflict. Shared by the HTTP API, the CLI and the Python client's server side.

    ``digest`` is the request's hash when the caller has already changed the submission (the
    API fills deployment defaults in after hashing what was sent).
    """
    submission = raw if isinstance(raw, TaskSubmission) else parse_submission(raw)
    check_submission(submission, tools)
    if idempotency_key is None:
        task = store.tasks.create(submission, tenant=tenant)
        created = True
    else:
        task, created = store.tasks.create_idempotent(
            submission, tenant=tenant, key=idempotency_key, request_hash=digest or request_hash(submission)
        )
    if queues is None:
        return Submitted(task, created)
    if created:
        try:
            queues.send(task.task_id, submission.priority)
        except Exception:
            store.tasks.delete_unstarted(
                task.task_id, idempotency=(tenant, idempotency_key) if idempotency_key else None
            )
            raise
    elif task.status is TaskStatus.QUEUED and task.lease_epoch == 0:
        # the first request may have died before its enqueue: a duplicate message is harmless
        queues.send(task.task_id, submission.priority)
    return Submitted(task, created)
