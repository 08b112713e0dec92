"""Submitting a task and reading tasks back: ``POST /tasks``, ``GET /tasks``,
``GET /tasks/{id}``, ``/result``, ``/trace`` and ``/compare/{other_id}`` (two runs side by side,
``api.run_diff``). Every read is of the caller's own tasks: another tenant's task is not found
(``views.owned``)."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Query

from agentq import observe
from agentq.api import views
from agentq.api.errors import JSON, responses
from agentq.api.models import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_TRACE_PAGE,
    IDEMPOTENCY_KEY_PATTERN,
    MAX_PAGE_SIZE,
    MAX_TRACE_PAGE,
    TRACE_PAGE_BYTES,
    TaskAccepted,
    TaskComparison,
    TaskLinks,
    TaskPage,
    TaskResult,
    TaskView,
    TracePage,
)
from agentq.api.routes.common import ApiDeps, PageCursor, Router, TaskId, builtin_script_only, user_query
from agentq.api.run_diff import compare_tasks
from agentq.api.user_submission import check_user_submission
from agentq.control.submit import request_hashes, submit_once, user_scoped_key
from agentq.core.errors import TaskNotFound, ValidationError
from agentq.core.models import TaskStatus, TaskSubmission


def router(deps: ApiDeps) -> Router:
    routes = Router()
    store = deps.store

    @routes.post(
        "/tasks",
        summary="Submit a task",
        description="Validates fully, creates the task and queues it; 202 with its id. With an `Idempotency-Key` "
        "header the same key and body return the same task (`created: false`), the same key with another body 409.",
        operation_id="createTask",
        tags=["tasks"],
        responses=responses(202, TaskAccepted, 400, 403, 409, 413, 415, 422, 423, description="Accepted and queued"),
    )
    def create_task(
        submission: Annotated[TaskSubmission, Body(description="goal, provider and model, constraints, priority")],
        idempotency_key: Annotated[
            str | None,
            Header(alias="Idempotency-Key", pattern=IDEMPOTENCY_KEY_PATTERN, description="retry-safe submits"),
        ] = None,
    ) -> Response[TaskAccepted]:
        caller = deps.caller()
        who = caller.tenant
        builtin_script_only(submission.script)
        user = caller.acting_user(submission.user)
        check_user_submission(caller, submission, store)
        if user != submission.user:  # a token's user: the request acts as it
            submission = submission.model_copy(update={"user": user})
        digest = request_hashes(submission)  # of the request as sent (with its user), before defaults fill it in
        legacy: tuple[str, ...] = ()
        if user is not None and idempotency_key is not None:  # one user's key never finds another's task
            idempotency_key, legacy = user_scoped_key(user, idempotency_key)
        accepted = submit_once(
            store,
            deps.tools,
            submission,
            tenant=who,
            queues=deps.queues,
            idempotency_key=idempotency_key,
            digest=digest,
            defaults=deps.defaults,
            key_id=caller.key_id,
            only_user=caller.user,  # a token's: its dependencies are its user's tasks
            legacy_keys=legacy,
        )
        task, created = accepted.task, accepted.created
        headers = {"Location": f"/tasks/{task.task_id}"}
        if created:
            observe.record_submitted()
        else:
            headers["Idempotent-Replayed"] = "true"
        body = TaskAccepted(
            task_id=task.task_id, status=task.status, created=created, links=TaskLinks.for_task(task.task_id)
        )
        return Response(status_code=202, content_type=JSON, body=body, headers=headers)

    @routes.get(
        "/tasks",
        summary="List tasks, newest first",
        operation_id="listTasks",
        tags=["tasks"],
        responses=responses(200, TaskPage, 400, 403, 422),
    )
    def list_tasks(
        status: Annotated[TaskStatus | None, Query(description="only tasks in this status")] = None,
        limit: Annotated[
            int,
            Query(
                ge=1,
                le=MAX_PAGE_SIZE,
                description=f"tasks per page, at most {MAX_PAGE_SIZE}: follow next_cursor for the next page",
            ),
        ] = DEFAULT_PAGE_SIZE,
        cursor: PageCursor = None,
        include_children: Annotated[bool, Query(description="also list sub-agents")] = False,
        metadata: Annotated[
            list[str] | None,
            Query(
                max_length=10,
                description="key=value (the first '=' splits it; the key is not empty, the value may be): only "
                "tasks whose metadata has it (repeat: every pair, each key once; anything else is 422 naming metadata). Read in "
                f"pages and filtered, at most {views.METADATA_SCAN_LIMIT} tasks a call: follow next_cursor for more",
                json_schema_extra={"items": {"type": "string", "pattern": "^[^=]+="}},
            ),
        ] = None,
        user: Annotated[
            str | None,
            user_query(
                "only tasks acting for this end user (from the user index, newest first); a caller "
                "acting as a user (a token's) lists only its own tasks, with or without it"
            ),
        ] = None,
    ) -> TaskPage:
        query = routes.current_event.query_string_parameters
        if status is None and query and "status" in query:  # given, but empty
            raise ValidationError("status: give one of the task statuses, or leave status out", field="status")
        caller = deps.caller()
        return views.task_page(
            store, caller.tenant, limit=limit, cursor=cursor, status=status, include_children=include_children,
            metadata=views.parse_metadata_filter(metadata or []), user=caller.reads_for(user, "the tasks"),
        )  # fmt: skip

    @routes.get(
        "/tasks/<task_id>",
        summary="A task's status",
        description="Status, step, tokens against the budget, cost, timestamps, children, latency, current activity.",
        operation_id="getTask",
        tags=["tasks"],
        responses=responses(200, TaskView, 404, 422),
    )
    def get_task(task_id: TaskId) -> TaskView:
        return views.task_view(store, views.owned(store, task_id, deps.caller()))

    @routes.get(
        "/tasks/<task_id>/result",
        summary="A finished task's result",
        description="409 task_not_finished until the task ends; `complete` is false for a partial result.",
        operation_id="getTaskResult",
        tags=["tasks"],
        responses=responses(200, TaskResult, 404, 409, 422),
    )
    def get_result(task_id: TaskId) -> TaskResult:
        return views.task_result(views.owned(store, task_id, deps.caller()))

    @routes.get(
        "/tasks/<task_id>/trace",
        summary="A task's trace, in commit order",
        description="LLM calls (model, tokens, timing), tool calls (input, output, duration), transitions "
        "and orphan LLM calls (paid for, never committed). Paginated: at most `limit` events a page, and fewer "
        f"once they pass {TRACE_PAGE_BYTES:,} bytes as JSON (never none), so a page fits one answer; follow "
        "`next_cursor`.",
        operation_id="getTaskTrace",
        tags=["tasks"],
        responses=responses(200, TracePage, 400, 404, 422),
    )
    def get_trace(
        task_id: TaskId,
        limit: Annotated[int, Query(ge=1, le=MAX_TRACE_PAGE, description="events per page")] = DEFAULT_TRACE_PAGE,
        cursor: PageCursor = None,
    ) -> TracePage:
        return views.trace_page(store, views.owned(store, task_id, deps.caller()), limit=limit, cursor=cursor)

    @routes.get(
        "/tasks/<task_id>/compare/<other_id>",
        summary="Two runs side by side",
        description="Each task's totals (steps, LLM and tool calls, tokens, cost, grade), each step beside the "
        "other's, and `diverged_at`, the first step that differs. A step is the same when it said and did the same "
        "(text, tool calls with their input and output, messages, a grade's score), never by timings or ids: a fork "
        "from step N is the same as its original up to N. Both tasks must be the caller's: another's is 404 naming "
        "the id's field.",
        operation_id="compareTasks",
        tags=["tasks"],
        responses=responses(200, TaskComparison, 404, 422),
    )
    def compare(task_id: TaskId, other_id: TaskId) -> TaskComparison:
        caller = deps.caller()
        first = views.owned(store, task_id, caller)
        try:
            other = views.owned(store, other_id, caller)
        except TaskNotFound:
            raise TaskNotFound(f"no task {other_id!r}", field="other_id") from None
        return compare_tasks(store, first, other)

    return routes
