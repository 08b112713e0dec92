"""Dead letters over HTTP, per tenant: list a tenant's dead-lettered tasks and redrive them.

A tier's DLQ is shared by every tenant, so both routes see only messages that name one of
the caller's tasks: the list leaves the others out, and the redrive moves the caller's own
messages and puts every other one back untouched (``queueing.dlq.redrive_for_tenant``). A
redrive names the messages it moves (``message_ids``, the listing's) when the caller was shown
them, as the console does: the tier's DLQ may hold more by then, which nobody saw. Both
look at the same first ``MAX_TENANT_REDRIVE`` (1,000) messages of a tier: what the list shows
the redrive moves, and a tenant's dead letter behind a hundred of another's is listed (and the
console's Redrive button, disabled on an empty list, can be pressed).
Messages that name no task (unreadable ones), or a task stored as no code of ours can read,
belong to no tenant; an operator sees and moves them with ``agentq dlq``, which talks to the
queues directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from agentq.api.models import DeadLetterPage, DeadLetterView, ErrorResponse, RedriveRequest, RedriveResult
from agentq.core.models import Priority, TaskStatus
from agentq.queueing.dlq import MAX_TENANT_REDRIVE, list_dead_letters, redrive_for_tenant
from agentq.queueing.queues import TaskQueues
from agentq.resources import TIERS
from agentq.storage.container import Storage

JSON = "application/json"
EVERY_ONE = RedriveRequest()  # no body, or {}: every one of the tenant's dead letters of the tier


def _responses(model: type, *errors: tuple[int, str]) -> dict[int, Any]:
    out: dict[int, Any] = {200: {"description": "Success", "content": {JSON: {"model": model}}}}
    for status, description in ((401, "No valid API key (unauthorized)"), *errors):
        out[status] = {"description": description, "content": {JSON: {"model": ErrorResponse}}}
    return out


def router(store: Storage, queues: TaskQueues, tenant: Callable[[], str]) -> Router:
    """The routes over ``store`` and ``queues``; ``tenant()`` is the caller's tenant."""
    router = Router()  # type: ignore[no-untyped-call]  # powertools leaves __init__ unannotated

    @router.get(
        "/dead-letters",
        summary="This tenant's dead letters",
        description="Per tier, each message's reason and its task's status, oldest first, from the first 1,000 "
        "messages of the tier's dead-letter queue (the redrive's bound).",
        operation_id="listDeadLetters",
        tags=["dead letters"],
        responses=_responses(DeadLetterPage, (422, "A field is invalid (validation_error); `field` names it")),
    )
    def list_letters(
        tier: Annotated[Priority | None, Query(description="one tier only")] = None,
    ) -> DeadLetterPage:
        who = tenant()
        views = [
            DeadLetterView(
                tier=d.tier,  # type: ignore[arg-type]  # one of TIERS
                message_id=d.message_id,
                task_id=d.task_id,
                task_status=TaskStatus(d.task_status),
                reason=d.reason,
                sent_at=d.sent_at,
            )
            for d in list_dead_letters(queues, store, tier=tier, limit=MAX_TENANT_REDRIVE, tenant=who)
            if d.task_id and d.task_status
        ]
        views.sort(key=lambda v: (TIERS.index(v.tier), v.sent_at, v.message_id))
        return DeadLetterPage(dead_letters=views)

    @router.post(
        "/dead-letters/<tier>/redrive",
        summary="Redrive this tenant's dead letters of a tier",
        description="Moves the messages naming this tenant's tasks back to the tier's queue; each task resumes "
        "from its checkpoint. Other tenants' messages stay where they are. `message_ids` (the listing's) moves "
        "those only, so a dead letter that came after the caller's listing stays; without it (no body, or `{}`) "
        "every one of the tenant's in the tier moves. Any other field is a 422 naming it.",
        operation_id="redriveDeadLetters",
        tags=["dead letters"],
        responses=_responses(
            RedriveResult,
            (404, "No such route (route_not_found): a tier path segment the router cannot match"),
            (422, "A field is invalid (validation_error); `field` names it"),
        ),
    )
    def redrive(
        tier: Annotated[Priority, Path(description="high, normal or low")],
        request: Annotated[RedriveRequest, Body(description="which dead letters")] = EVERY_ONE,
    ) -> RedriveResult:
        done = redrive_for_tenant(queues, store, tenant(), tier, message_ids=request.message_ids)
        return RedriveResult(tier=tier, moved=done.moved, task_ids=done.task_ids)

    return router
