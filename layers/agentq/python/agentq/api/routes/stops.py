"""The stop button: ``POST /stops`` (stop one scope of the caller's tenant: cancel its tasks,
refuse new ones with 423), ``GET /stops`` (the tenant's stops), ``POST /stops/resume`` (lift
one). A key acts for its tenant only: another tenant's name is 403, another tenant's key id is
404 as an unknown one is; an end user's token reaches none of these (``api.app.USER_PATHS``)."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from agentq.api.errors import responses
from agentq.api.models.stops import ResumeResult, StopList, StopRequest, StopResult, StopScopeBody, StopView
from agentq.api.routes.common import ApiDeps, Router
from agentq.control import stops as control
from agentq.core.stops import StopNotFound, StopRecord, parse_scope


def view(stop: StopRecord) -> StopView:
    return StopView(kind=stop.scope.kind, value=stop.scope.value, stopped_at=stop.stopped_at, by=stop.by,
                    reason=stop.reason)  # fmt: skip


def router(deps: ApiDeps) -> Router:
    routes = Router()
    store, tenant = deps.store, deps.tenant

    @routes.post(
        "/stops",
        summary="Stop a scope: cancel its tasks, refuse new ones",
        description="Stores the stop, then cancels every running and queued task of the scope (one of `user`, "
        "`agent`, `key`, `tenant`), sub-agents included. Until `POST /stops/resume`, a submission, a follow-up "
        "message or a schedule's fire in the scope is 423 `scope_stopped` naming it, and a worker cancels a task of "
        "it instead of running it. Once it returns, no request of the scope's tasks carries a vault credential (a "
        "workspace's is refused 403 naming the stop) and a workspace shell of theirs that may reach the network is "
        "killed within seconds. Stopping a stopped scope keeps its stop and sweeps again (`created: false`).",
        operation_id="stopScope",
        tags=["control"],
        responses=responses(200, StopResult, 400, 403, 404, 413, 415, 422),
    )
    def stop(body: Annotated[StopRequest, Body(description="exactly one scope, and why")]) -> StopResult:
        caller = deps.caller()
        scope = parse_scope(body.fields())
        report = control.stop(store, caller.tenant, scope, by=caller.key_id, reason=body.reason, fanout=deps.fanout,
                              queues=deps.queues, slots=deps.defaults.running_slots(store))  # fmt: skip
        return StopResult(stop=view(report.stop), created=report.created, cancelled=report.cancelled,
                          were_running=report.were_running)  # fmt: skip

    @routes.get("/stops", summary="The tenant's stopped scopes", operation_id="listStops", tags=["control"],
                responses=responses(200, StopList))  # fmt: skip
    def list_stops() -> StopList:
        return StopList(stops=[view(s) for s in store.stops.list(tenant())])

    @routes.post(
        "/stops/resume",
        summary="Resume a stopped scope",
        description="New tasks of the scope are accepted again; the tasks the stop cancelled stay cancelled. "
        "404 `stop_not_found` when the scope is not stopped.",
        operation_id="resumeScope",
        tags=["control"],
        responses=responses(200, ResumeResult, 400, 403, 404, 413, 415, 422),
    )
    def resume(body: Annotated[StopScopeBody, Body(description="exactly one scope")]) -> ResumeResult:
        scope = parse_scope(body.fields())
        removed = control.resume(store, tenant(), scope)
        if removed is None:
            raise StopNotFound(f"{scope.kind}: {scope} is not stopped", field=scope.kind)
        return ResumeResult(resumed=view(removed))

    return routes
