"""Schedules: ``POST /schedules`` (create or replace by name), ``GET /schedules``, ``GET
/schedules/{name}``, ``DELETE /schedules/{name}``; the caller's own only (``control.schedules``)."""

from __future__ import annotations

import re
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path

from agentq.api.cursors import InvalidCursor, decode_cursor, encode_cursor, within_budget
from agentq.api.errors import JSON, responses
from agentq.api.models import MAX_LISTING_PAGE, ScheduleList, ScheduleView
from agentq.api.routes.common import ApiDeps, ListingLimit, PageCursor, Router
from agentq.control.schedules import create_schedule, delete_schedule
from agentq.core.schedules import NAME_PATTERN, ScheduleSpec
from agentq.storage.schedules import Schedule

ScheduleName = Annotated[str, Path(pattern=NAME_PATTERN, description="a schedule's name")]
SCHEDULES_CURSOR = "schedules"


def _name_after(cursor: str) -> str:
    """The schedule name a ``GET /schedules`` cursor goes on after."""
    name = decode_cursor(SCHEDULES_CURSOR, cursor)
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise InvalidCursor("cursor is not one this API issued; pass next_cursor back unchanged", field="cursor")
    return name


def view(schedule: Schedule) -> ScheduleView:
    return ScheduleView(
        name=schedule.spec.name, expression=schedule.spec.expression, overlap=schedule.spec.overlap,
        submission=schedule.spec.submission, created_at=schedule.created_at, next_fire_at=schedule.next_fire_at,
        last_task_id=schedule.last_task_id, fired=schedule.fired, skipped=schedule.skipped,
        failed=schedule.failed, last_error=schedule.last_error,
    )  # fmt: skip


def router(deps: ApiDeps) -> Router:
    routes = Router()
    store, tenant = deps.store, deps.tenant

    @routes.post(
        "/schedules",
        summary="Create (or replace) a schedule",
        description="A cron or rate expression (EventBridge Scheduler's, UTC) and the task each fire submits. "
        "Validated fully, as POST /tasks validates the submission. One task per fire time; with overlap `skip` "
        "a fire while the previous task is live submits nothing.",
        operation_id="createSchedule",
        tags=["schedules"],
        responses=responses(201, ScheduleView, 400, 403, 404, 413, 415, 422, description="Created"),
    )
    def create(spec: Annotated[ScheduleSpec, Body(description="the schedule")]) -> Response[ScheduleView]:
        named = spec.submission.get("user")
        deps.caller().acting_user(named if isinstance(named, str) else None)  # a key names a user only if allowed
        schedule = create_schedule(store, deps.tools, spec.model_dump(), tenant=tenant())
        headers = {"Location": f"/schedules/{schedule.spec.name}"}
        return Response(status_code=201, content_type=JSON, body=view(schedule), headers=headers)

    @routes.get(
        "/schedules",
        summary="List schedules by name, a page at a time",
        description="A page holds fewer than `limit` schedules once they pass 2 MB as JSON (never none): follow "
        "`next_cursor`.",
        operation_id="listSchedules",
        tags=["schedules"],
        responses=responses(200, ScheduleList, 400, 422),
    )
    def list_schedules(limit: ListingLimit = MAX_LISTING_PAGE, cursor: PageCursor = None) -> ScheduleList:
        found, more = store.schedules.page(tenant(), limit=limit, after=_name_after(cursor) if cursor else None)
        page, more = within_budget([view(s) for s in found], more)
        next_cursor = encode_cursor(SCHEDULES_CURSOR, page[-1].name) if more and page else None
        return ScheduleList(schedules=page, next_cursor=next_cursor)

    @routes.get("/schedules/<name>", summary="A schedule", operation_id="getSchedule", tags=["schedules"],
                responses=responses(200, ScheduleView, 404, 422))  # fmt: skip
    def get_schedule(name: ScheduleName) -> ScheduleView:
        return view(store.schedules.get(tenant(), name))

    @routes.delete("/schedules/<name>", summary="Delete a schedule", operation_id="deleteSchedule",
                   tags=["schedules"], responses=responses(200, ScheduleView, 404, 422))  # fmt: skip
    def delete(name: ScheduleName) -> ScheduleView:
        schedule = store.schedules.get(tenant(), name)
        delete_schedule(store, tenant=tenant(), name=name)
        return view(schedule)

    return routes
