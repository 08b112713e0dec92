"""What a caller does to one of its tasks: ``POST /tasks/{id}/cancel|approve|reject|budget|fork``.

The state checks are the control plane's (``agentq.control.operations``): a task whose state
forbids the action answers 409 and is left as it was. Every action but cancel takes a JSON body
and answers the task as it is now, so those four share one route shape (``action``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from agentq import observe
from agentq.api import views
from agentq.api.errors import JSON, responses
from agentq.api.models import BudgetRequest, CancelResult, DecisionRequest, ForkRequest, TaskView
from agentq.api.routes.common import ApiDeps, F, Router, TaskId, builtin_script_only, visible
from agentq.api.user_submission import user_fork
from agentq.control import operations as control

NO_NOTE = DecisionRequest()  # approve/reject without a body
BODY_ERRORS = (400, 404, 409, 413, 415, 422)  # a route with a body: unreadable, too large, not JSON too


def action(
    routes: Router,
    verb: str,
    summary: str,
    operation_id: str,
    *,
    description: str | None = None,
    ok: int = 200,
    ok_description: str = "Success",
    errors: tuple[int, ...] = (),
) -> Callable[[F], F]:
    """The route of ``POST /tasks/{id}/<verb>`` with a JSON body, answering a ``TaskView``."""
    return routes.post(
        f"/tasks/<task_id>/{verb}",
        summary=summary,
        description=description,
        operation_id=operation_id,
        tags=["control"],
        responses=responses(ok, TaskView, *BODY_ERRORS, *errors, description=ok_description),
    )


def router(deps: ApiDeps) -> Router:
    routes = Router()
    store, tenant = deps.store, deps.tenant

    @routes.post(
        "/tasks/<task_id>/cancel",
        summary="Cancel a task and its sub-agents",
        operation_id="cancelTask",
        tags=["control"],
        responses=responses(200, CancelResult, 404, 409, 422),
    )
    def cancel_task(task_id: TaskId) -> CancelResult:
        visible(deps, task_id)
        slots = deps.defaults.running_slots(store)
        cancelled = control.cancel(store, task_id, tenant=tenant(), fanout=deps.fanout, queues=deps.queues, slots=slots)
        return CancelResult(task_id=task_id, cancelled=cancelled)

    def decide(approved: bool) -> Callable[..., TaskView]:
        def decision_route(task_id: TaskId, decision: Annotated[DecisionRequest, Body()] = NO_NOTE) -> TaskView:
            visible(deps, task_id)
            caller = deps.caller()
            task = control.decide(
                store, deps.queues, task_id, approved=approved, note=decision.note, by=caller.tenant,
                tenant=caller.tenant, by_user=caller.user, tool_use_id=decision.tool_use_id,
            )  # fmt: skip
            return views.task_view(store, task)

        return decision_route

    who = (
        "Send the held call's id as `tool_use_id` (the view's `pending_tool_use_id`): the decision is of that call "
        "only, and once it is decided, or the task holds another, it is 409 `illegal_transition` naming "
        "`tool_use_id`, nothing changed (a second reviewer's click, a double click, a retry). "
        "An end user's token decides only a held call its user may (`approver: user`); one only the tenant decides "
        "(`approver: tenant`: a policy rule's ask by default) is 403 `not_the_approver`, nothing changed."
    )
    action(routes, "approve", "Approve a paused task's request", "approveTask", description=who, errors=(403,))(
        decide(True)
    )
    action(routes, "reject", "Reject a paused task's request", "rejectTask", description=who, errors=(403,))(
        decide(False)
    )

    @action(
        routes,
        "budget",
        "Raise a root task's budget",
        "raiseBudget",
        description="A cost_exceeded task resumes from its checkpoint.",
    )
    def budget(task_id: TaskId, raise_by: Annotated[BudgetRequest, Body()]) -> TaskView:
        visible(deps, task_id)
        task = control.raise_budget(
            store,
            deps.queues,
            task_id,
            add_tokens=raise_by.add_tokens,
            add_steps=raise_by.add_steps,
            add_usd=raise_by.add_usd,
            tenant=tenant(),
        )
        return views.task_view(store, task)

    @action(
        routes,
        "fork",
        "Fork a task at a committed step",
        "forkTask",
        description="A new task from the source's steps 1..at_step (copied, never re-run), with any overrides. "
        "A fork of an agent's task keeps its `agent` (name@N); what its overrides replace of that version "
        "(provider, model, system, script, constraints.tools) its view lists in `overridden`.",
        ok=202,
        ok_description="The new task, queued",
        errors=(423,),
    )
    def fork(task_id: TaskId, request: Annotated[ForkRequest, Body()]) -> Response[TaskView]:
        visible(deps, task_id)
        builtin_script_only(request.script)
        if deps.caller().bound:
            user_fork(request)
        new = control.fork(
            store,
            deps.tools,
            deps.queues,
            task_id,
            at_step=request.at_step,
            overrides=request.overrides(),
            tenant=tenant(),
        )
        observe.record_submitted()
        headers = {"Location": f"/tasks/{new.task_id}"}
        return Response(status_code=202, content_type=JSON, body=views.task_view(store, new), headers=headers)

    return routes
