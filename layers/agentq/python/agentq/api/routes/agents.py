"""Agent definitions: ``POST /agents`` (a new version), ``GET /agents``, ``GET /agents/{name}``
(the latest, or ``?version=N``) and ``GET /agents/{name}/versions``. Every read and write is of
the caller's own agents: another tenant's agent is not found."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from agentq.api.cursors import version_page
from agentq.api.errors import JSON, responses
from agentq.api.models import MAX_LISTING_PAGE, AgentCreated, AgentList, AgentVersions
from agentq.api.routes.common import ApiDeps, ListingLimit, PageCursor, Router, builtin_script_only
from agentq.control.agents import create_agent
from agentq.core.agents import NAME_PATTERN, AgentSpec, AgentVersion

AgentName = Annotated[str, Path(pattern=NAME_PATTERN, description="an agent's name")]
VERSIONS_CURSOR = "agent_versions"


def router(deps: ApiDeps) -> Router:
    routes = Router()
    store, tenant = deps.store, deps.tenant

    @routes.post(
        "/agents",
        summary="Create an agent version",
        description="Validates fully (tools known, model priced) and stores the next version of `name`, immutable. "
        "If the latest version is exactly this definition, nothing is created: 200 with that version.",
        operation_id="createAgent",
        tags=["agents"],
        responses={
            **responses(201, AgentCreated, 400, 409, 413, 415, 422, description="Created"),
            200: {"description": "Unchanged: the latest version", "content": {JSON: {"model": AgentCreated}}},
        },
    )
    def create(spec: Annotated[AgentSpec, Body(description="the agent's definition")]) -> Response[AgentCreated]:
        builtin_script_only(spec.script)
        version, created = create_agent(store, deps.tools, spec, tenant=tenant(), mcp=deps.mcp)
        headers = {"Location": f"/agents/{version.name}?version={version.version}"}
        body = AgentCreated(created=created, agent=version)
        return Response(status_code=201 if created else 200, content_type=JSON, body=body, headers=headers)

    @routes.get("/agents", summary="List agents", operation_id="listAgents", tags=["agents"],
                responses=responses(200, AgentList))  # fmt: skip
    def list_agents() -> AgentList:
        return AgentList(agents=store.agents.list(tenant()))

    @routes.get(
        "/agents/<name>",
        summary="An agent's latest version, or one version",
        operation_id="getAgent",
        tags=["agents"],
        responses=responses(200, AgentVersion, 404, 422),
    )
    def get_agent(
        name: AgentName,
        version: Annotated[int | None, Query(ge=1, description="a version number (default: the latest)")] = None,
    ) -> AgentVersion:
        return store.agents.get(tenant(), name, version)

    @routes.get(
        "/agents/<name>/versions",
        summary="An agent's versions, newest first, a page at a time",
        description="A page holds fewer than `limit` versions once they pass 2 MB as JSON (never none): follow "
        "`next_cursor`.",
        operation_id="listAgentVersions",
        tags=["agents"],
        responses=responses(200, AgentVersions, 400, 404, 422),
    )
    def versions(name: AgentName, limit: ListingLimit = MAX_LISTING_PAGE, cursor: PageCursor = None) -> AgentVersions:
        page, next_cursor = version_page(
            VERSIONS_CURSOR,
            [name],
            cursor,
            lambda before: store.agents.versions_page(tenant(), name, limit=limit, before=before),
        )
        return AgentVersions(name=name, versions=page, next_cursor=next_cursor)

    return routes
