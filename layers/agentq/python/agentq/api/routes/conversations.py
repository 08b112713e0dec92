"""Talking to a task: ``POST /tasks/{id}/messages``, ``GET /tasks/{id}/messages``,
``POST /tasks/{id}/interrupt`` and ``POST /tasks/{id}/close`` (``agentq.control.conversations``).

A message is accepted (202) once it is durable and numbered; the agent reads it at its next turn
boundary, or, for an answered or interrupted task, when the follow-up run it queued claims it.
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Query

from agentq.api import views
from agentq.api.errors import JSON, responses
from agentq.api.models import (
    IDEMPOTENCY_KEY_PATTERN,
    MAX_MESSAGE_PAGE,
    MESSAGE_PAGE_BYTES,
    CloseResult,
    InterruptResult,
    MessageAccepted,
    MessageList,
    MessageRequest,
)
from agentq.api.routes.common import ApiDeps, PageCursor, Router, TaskId, visible
from agentq.control import conversations as control
from agentq.core.endusers import UserNotAllowed


def router(deps: ApiDeps) -> Router:
    routes = Router()
    store, tenant = deps.store, deps.tenant

    @routes.post(
        "/tasks/<task_id>/messages",
        summary="Send a task a message",
        description="To a running, queued, waiting or paused task: delivered at its next turn boundary, in the "
        "order messages were accepted (its `double_texting` policy may interrupt the turn in flight, or refuse while "
        "it is busy). To an answered (`succeeded`) or interrupted (`idle`) task: a follow-up that continues the same "
        "conversation. A failed, cancelled, timed-out or out-of-budget task answers 409 with the reason (send "
        "`add_tokens` to give an out-of-budget task more). With an `Idempotency-Key` a retry sends nothing twice.",
        operation_id="sendMessage",
        tags=["conversation"],
        responses=responses(202, MessageAccepted, 400, 403, 404, 409, 413, 415, 422, 423, description="Accepted"),
    )
    def send(
        task_id: TaskId,
        message: Annotated[MessageRequest, Body()],
        idempotency_key: Annotated[
            str | None,
            Header(alias="Idempotency-Key", pattern=IDEMPOTENCY_KEY_PATTERN, description="retry-safe sends"),
        ] = None,
    ) -> Response[MessageAccepted]:
        caller = deps.caller()
        named = caller.acting_user(message.user)
        task = views.owned(store, task_id, caller) if caller.bound or named is not None else None
        if task is not None and named is not None and task.user != named:
            raise UserNotAllowed(f"user: task {task_id} acts for another user, not {named!r}", field="user")
        sent = control.send_message(
            store,
            deps.queues,
            task_id,
            message.text,
            tenant=tenant(),
            idempotency_key=idempotency_key,
            add_tokens=message.add_tokens,
            add_steps=message.add_steps,
            add_usd=message.add_usd,
        )
        body = MessageAccepted(
            task_id=task_id,
            message_id=sent.message.message_id,
            seq=sent.message.seq,
            status=sent.status,
            reopened=sent.reopened,
            interrupting=sent.interrupting,
            replayed=sent.replayed,
        )
        headers = {"Idempotent-Replayed": "true"} if sent.replayed else {}
        return Response(status_code=202, content_type=JSON, body=body, headers=headers)

    @routes.get(
        "/tasks/<task_id>/messages",
        summary="The messages a task was sent",
        description="In the order accepted (the order the agent reads them), each with whether the agent has read it. "
        f"Paginated: at most `limit` a page, and fewer once their texts pass {MESSAGE_PAGE_BYTES:,} bytes as JSON "
        "(never none), so a page of long messages fits one answer; follow `next_cursor`.",
        operation_id="listMessages",
        tags=["conversation"],
        responses=responses(200, MessageList, 400, 404, 422),
    )
    def listed(
        task_id: TaskId,
        limit: Annotated[
            int, Query(ge=1, le=MAX_MESSAGE_PAGE, description="messages per page: follow next_cursor for the next")
        ] = MAX_MESSAGE_PAGE,
        cursor: PageCursor = None,
    ) -> MessageList:
        visible(deps, task_id)
        return views.message_page(store, task_id, tenant(), limit=limit, cursor=cursor)

    @routes.post(
        "/tasks/<task_id>/interrupt",
        summary="Interrupt a task",
        description="The agent stops at its earliest safe point: the answer of a model call in flight is discarded "
        "(and charged), a tool call in flight completes and is recorded, and the task waits `idle` for the next "
        "message. A task already idle answers as it is; one that is not running or queued answers 409.",
        operation_id="interruptTask",
        tags=["conversation"],
        responses=responses(202, InterruptResult, 404, 409, 422, description="Recorded"),
    )
    def interrupt(task_id: TaskId) -> Response[InterruptResult]:
        visible(deps, task_id)
        status = control.interrupt(store, task_id, tenant=tenant())
        return Response(status_code=202, content_type=JSON, body=InterruptResult(task_id=task_id, status=status))

    @routes.post(
        "/tasks/<task_id>/close",
        summary="Close a task's conversation",
        description="It takes no more messages (409 from then on); the task itself is left as it is.",
        operation_id="closeConversation",
        tags=["conversation"],
        responses=responses(200, CloseResult, 404, 422),
    )
    def close(task_id: TaskId) -> CloseResult:
        visible(deps, task_id)
        control.close(store, task_id, tenant=tenant())
        return CloseResult(task_id=task_id, closed=True)

    return routes
