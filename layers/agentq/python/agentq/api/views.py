"""Read-only views the HTTP API answers with: a task's status view, list pages, the trace.

Built from the store alone (no worker involved); the response shapes are ``api_models``. This
module builds the list pages (``task_page``, with its metadata filter; ``message_page``) and a
finished task's result, and re-exports the rest, each from the module of its view: ``api.cursors`` (the page
cursors), ``api.task_view`` (a task's status view and summary), ``api.trace_view`` (the trace).
"""

from __future__ import annotations

import json

from agentq.api.cursors import InvalidCursor as InvalidCursor
from agentq.api.cursors import decode_cursor as decode_cursor
from agentq.api.cursors import encode_cursor as encode_cursor
from agentq.api.cursors import fitting
from agentq.api.models import (
    MESSAGE_PAGE_BYTES,
    MessageList,
    MessageView,
    TaskPage,
    TaskResult,
)
from agentq.api.task_view import activity as activity
from agentq.api.task_view import children_summary as children_summary
from agentq.api.task_view import owned as owned
from agentq.api.task_view import retry_view as retry_view
from agentq.api.task_view import task_summary as task_summary
from agentq.api.task_view import task_view as task_view
from agentq.api.trace_view import Key as Key
from agentq.api.trace_view import step_views as step_views
from agentq.api.trace_view import trace_page as trace_page
from agentq.control import conversations
from agentq.core.errors import AgentqError, ValidationError
from agentq.core.metadata import BadPair, parse_pairs
from agentq.core.models import (
    Task,
    TaskStatus,
)
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.messages import MAX_MESSAGES_PER_TASK


class NotFinished(AgentqError):
    code = "task_not_finished"


METADATA_SCAN_LIMIT = 1000  # tasks one metadata search reads before it answers with a cursor
_METADATA_SCAN_PAGE = 100


def parse_metadata_filter(pairs: list[str]) -> dict[str, str]:
    """``?metadata=`` words as a dict; a word that is not ``key=value`` is a ValidationError naming ``metadata``."""
    try:
        return parse_pairs(pairs)
    except BadPair as exc:
        raise ValidationError(f"metadata: {exc}", field="metadata") from None


def task_page(
    store: Storage,
    tenant: str,
    *,
    limit: int,
    cursor: str | None,
    status: TaskStatus | None,
    include_children: bool,
    metadata: dict[str, str] | None = None,
    user: str | None = None,
) -> TaskPage:
    """A page of the tenant's tasks (with ``user``: of those acting for that user), newest first. With ``metadata`` (every pair must match) the
    tasks are read in pages and filtered here, since metadata is not on the index: at most
    ``METADATA_SCAN_LIMIT`` are read per call, so a page may hold fewer matches than ``limit``
    while ``next_cursor`` says more may follow (the same contract as a status filter)."""
    after = None
    if cursor:
        after = decode_cursor("tasks", cursor)
        if not isinstance(after, str) or not keys.TENANT_INDEX_SK.fullmatch(after):
            raise InvalidCursor("cursor is not one this API issued; pass next_cursor back unchanged", field="cursor")
    if not metadata:
        tasks, last = store.tasks.list_for_tenant(
            tenant, limit=limit, after=after, status=status, roots_only=not include_children, user=user
        )
        return TaskPage(
            tasks=[task_summary(t) for t in tasks if t.tenant == tenant and (user is None or t.user == user)],
            next_cursor=encode_cursor("tasks", last) if last else None,
        )
    found: list[Task] = []
    last = after
    # At most METADATA_SCAN_LIMIT tasks read, in listing calls of a page each (with a status
    # filter a call's index reads are bounded too), however rare the match.
    for _ in range(max(1, METADATA_SCAN_LIMIT // _METADATA_SCAN_PAGE)):
        tasks, last = store.tasks.list_for_tenant(
            tenant, limit=_METADATA_SCAN_PAGE, after=last, status=status, roots_only=not include_children, user=user
        )
        for task in tasks:
            meta = task.submission.metadata
            if (
                task.tenant == tenant
                and (user is None or task.user == user)
                and all(meta.get(k) == v for k, v in metadata.items())
            ):
                found.append(task)
                if len(found) == limit:  # go on after this one next time
                    return TaskPage(
                        tasks=[task_summary(t) for t in found],
                        next_cursor=encode_cursor("tasks", keys.tenant_index_sk(task.created_at, task.task_id)),
                    )
        if last is None:
            break
    return TaskPage(tasks=[task_summary(t) for t in found], next_cursor=encode_cursor("tasks", last) if last else None)


def message_page(store: Storage, task_id: str, tenant: str, *, limit: int, cursor: str | None) -> MessageList:
    """A page of the messages the task accepted, in order: at most ``limit``, and fewer once
    their texts pass ``MESSAGE_PAGE_BYTES`` as JSON (never none), so a page always fits a
    Lambda's answer. The cursor holds the task and the last message's number."""
    after = 0
    if cursor:
        held = decode_cursor("messages", cursor)
        if not isinstance(held, dict) or held.get("task") != task_id:
            raise InvalidCursor("cursor does not belong to this task's messages", field="cursor")
        seq = held.get("after")
        if type(seq) is not int or not 0 <= seq <= MAX_MESSAGES_PER_TASK:
            raise InvalidCursor("cursor is not one this API issued; pass next_cursor back unchanged", field="cursor")
        after = seq
    task, messages = conversations.messages(store, task_id, tenant=tenant, after=after, limit=limit)
    # each text escaped as the answer escapes it (ASCII), or longer
    shown = messages[: fitting((len(json.dumps(m.text)) for m in messages), MESSAGE_PAGE_BYTES)]
    page = [MessageView(message_id=m.message_id, seq=m.seq, text=m.text, sent_at=m.sent_at,
                        delivered=m.seq <= task.messages_delivered) for m in shown]  # fmt: skip
    last = page[-1].seq if page else after
    more = last < task.messages_received
    return MessageList(
        task_id=task_id,
        messages=page,
        next_cursor=encode_cursor("messages", {"task": task_id, "after": last}) if more else None,
    )


def task_result(task: Task) -> TaskResult:
    if not task.status.terminal:
        raise NotFinished(
            f"task {task.task_id} is {task.status.value}; its result is ready when it ends (GET /tasks/{task.task_id})",
            field="task_id",
        )
    output = None
    if task.submission.output_schema is not None and task.status is TaskStatus.SUCCEEDED and task.result:
        output = json.loads(task.result)  # the engine stores a valid answer as JSON, and only that
    return TaskResult(
        task_id=task.task_id,
        status=task.status,
        complete=task.status is TaskStatus.SUCCEEDED,
        result=task.result,
        output=output,
        error=task.error,
        finished_at=task.finished_at,
    )
