"""``GET /tasks/{id}/events``: a task's events (or its tree's) after a cursor.

With ``Accept: text/event-stream`` the answer is server-sent events; otherwise JSON pages
(``EventPage``) with ``next_cursor``. Here, in the request/response handler (the API Lambda),
a stream holds what is committed now and ends; its ``retry:`` (with the first event) brings an
``EventSource`` back with ``Last-Event-ID`` for the rest. The local API server (``api/http_server.py``) and the
streaming function in AWS keep the connection open instead (``api/event_hub.py``). Both check
the task (404) and the cursor (400) before any event.
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from agentq.api.errors import JSON, responses
from agentq.api.event_hub import END, frames
from agentq.api.events import Watch, read_once
from agentq.api.models import DEFAULT_EVENT_PAGE, MAX_EVENT_PAGE, EventPage
from agentq.api.routes.common import ApiDeps, Router, TaskId
from agentq.api.views import owned

EVENT_STREAM = "text/event-stream"


def wants_stream(accept: str | None) -> bool:
    return bool(accept) and EVENT_STREAM in str(accept).lower()


def router(deps: ApiDeps) -> Router:
    routes = Router()
    store, _tenant = deps.store, deps.tenant

    documented = responses(200, EventPage, 400, 404, 422)
    documented[200]["content"][EVENT_STREAM] = {"schema": {"type": "string"}}
    documented[204] = {"description": "a stream with nothing more to send: the task has ended"}

    @routes.get(
        "/tasks/<task_id>/events",
        summary="A task's events: a resumable stream",
        description="Every status change, committed step, retry, approval, spawn and budget change in commit "
        "order, each with an id; the live text of a model call as uncommitted deltas. `Accept: text/event-stream` "
        "answers server-sent events (resume with `Last-Event-ID`), anything else JSON pages (resume with "
        "`?after=next_cursor`). `tree=true`: the task and its sub-agents (at most 200 tasks: the first 199 sub-agents "
        "spawned), each event naming its task and its `tree_path`; each task's events in its commit order, merged "
        "across tasks by time.",
        operation_id="getTaskEvents",
        tags=["tasks"],
        responses=documented,
    )
    def get_events(
        task_id: TaskId,
        after: Annotated[
            str | None,
            Query(
                max_length=8192,
                description="an event's id (or next_cursor) as the API sent it: what follows it. A task's is "
                "<task_id>:<step>.<seq>.<rank>.<sub> (ASCII digits); with tree=true, the tree's id. An id of "
                "another task or tree, or past the task's last event, is 400 invalid_cursor; the same goes for "
                "Last-Event-ID",
            ),
        ] = None,
        tree: Annotated[bool, Query(description="also the task's sub-agents (the first 199 spawned)")] = False,
        limit: Annotated[int, Query(ge=1, le=MAX_EVENT_PAGE, description="events per page")] = DEFAULT_EVENT_PAGE,
    ) -> Response[Any]:
        event = routes.current_event
        last_id = event.headers.get("Last-Event-ID")
        task = owned(store, task_id, deps.caller())
        field = "after" if after else "Last-Event-ID"
        watch = Watch.open(store, task, after or last_id, tree=tree, field=field)
        events = read_once(watch, limit=limit)
        if wants_stream(event.headers.get("Accept")):
            if not events and watch.done:
                return Response(status_code=204, body="")
            body = (frames(events) or ": nothing committed since\n\n") + (END if watch.done else "")
            return Response(status_code=200, content_type=EVENT_STREAM, body=body,
                            headers={"Cache-Control": "no-cache"})  # fmt: skip
        page = EventPage(task_id=task_id, events=events, next_cursor=watch.cursor() or None, done=watch.done)  # type: ignore[arg-type]
        return Response(status_code=200, content_type=JSON, body=page.model_dump_json())

    return routes
