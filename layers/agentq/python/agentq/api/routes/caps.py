"""``/caps``: a tenant's caps per end user, agent and API key (``core.caps``, ``control.caps``).
Tenant-wide settings: an API key's (a user's token is answered 403, ``api.app.USER_PATHS``).
Every key of a cap starts with the caller's tenant: another tenant's caps are unreachable."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from agentq.api.errors import responses
from agentq.api.models.caps import CapList, CapView, WindowUse
from agentq.api.routes.common import ApiDeps, Router
from agentq.control import caps
from agentq.core.caps import NAME, CapLimits
from agentq.core.pricing import dollars

TAGS = ["caps"]
ScopeName = Annotated[str, Path(description="user, agent or key (anything else is a 422 naming scope)")]
Name = Annotated[
    str, Path(pattern=f"^{NAME.pattern}$", description="the end user, the agent's name or the API key's id")
]


def view(state: caps.CapState) -> CapView:
    u = state.usage

    def window(w: str) -> WindowUse:
        return WindowUse(tokens=u[f"{w}_tokens"], usd=str(dollars(u[f"{w}_usd"])),
                         used_tokens=u[f"{w}_used_tokens"], used_usd=str(dollars(u[f"{w}_used_usd"])))  # fmt: skip

    return CapView(scope=state.cap.scope, name=state.cap.name, limits=state.cap.limits, hour=window("hour"),
                   day=window("day"))  # fmt: skip


def router(deps: ApiDeps) -> Router:
    routes = Router()

    @routes.put(
        "/caps/<scope>/<name>",
        summary="Set a scope's caps (tokens and dollars, an hour and a day, with soft thresholds)",
        description="Replaces the caps of one end user, agent or API key of the tenant. Each call of a task acting "
        "for that scope holds on its windows first: at a cap the task waits for the window to roll over; past a "
        "soft threshold it pauses for approval. Caps below zero, a soft threshold above its cap or without one, an "
        "unknown scope: 422 naming the field, nothing stored.",
        operation_id="putCap",
        tags=TAGS,
        responses=responses(200, CapView, 400, 403, 404, 415, 422),
    )
    def put(scope: ScopeName, name: Name, body: Annotated[CapLimits, Body(description="the caps")]) -> CapView:
        return view(caps.put(deps.store, deps.tenant(), scope, name, body))

    @routes.get("/caps", summary="List the tenant's caps with what each window holds now", operation_id="listCaps",
                tags=TAGS, responses=responses(200, CapList, 403, 422))  # fmt: skip
    def list_caps(
        scope: Annotated[str | None, Query(description="only this scope's (user, agent or key)")] = None,
    ) -> CapList:
        return CapList(caps=[view(s) for s in caps.listing(deps.store, deps.tenant(), scope)])

    @routes.get("/caps/<scope>/<name>", summary="One scope's caps and what its windows hold now",
                operation_id="getCap", tags=TAGS, responses=responses(200, CapView, 403, 404, 422))  # fmt: skip
    def get(scope: ScopeName, name: Name) -> CapView:
        return view(caps.get(deps.store, deps.tenant(), scope, name))

    @routes.delete("/caps/<scope>/<name>", summary="Remove a scope's caps (answers what they were)",
                   operation_id="deleteCap", tags=TAGS, responses=responses(200, CapView, 403, 404, 422))  # fmt: skip
    def delete(scope: ScopeName, name: Name) -> CapView:
        return view(caps.delete(deps.store, deps.tenant(), scope, name))

    return routes
