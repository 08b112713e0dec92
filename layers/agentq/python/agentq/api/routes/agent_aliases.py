"""Aliases of an agent (``core.aliases``): ``PUT /agents/{name}/aliases/{alias}`` (point it, or
move it: one conditional write), ``GET`` one or the list, ``DELETE``. The caller's own agents
only: another tenant's alias is not found, and never resolves for anyone else. And ``POST
/tasks/{id}/agent``: the one way a task leaves the version it was pinned to. ``GET
/agents/{name}/quality``: what the aliases' online evaluation graded, per version and hour."""

from __future__ import annotations

import time
from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from agentq.api.errors import Forbidden, responses
from agentq.api.models import AgentAliasList, AgentQuality, MoveRequest, TaskMoved
from agentq.api.routes.common import ApiDeps, Router, TaskId, visible
from agentq.control import aliases as control_aliases
from agentq.control.aliases import move_task
from agentq.core.agents import NAME_PATTERN
from agentq.core.aliases import ALIAS_PATTERN, AgentAlias, AliasRequest
from agentq.core.quality import MAX_HOURS, hour_of

AgentName = Annotated[str, Path(pattern=NAME_PATTERN, description="an agent's name")]
AliasName = Annotated[
    str, Path(pattern=ALIAS_PATTERN, description="an alias: a lowercase letter, then letters, digits, '-', '_'")
]


def router(deps: ApiDeps) -> Router:
    routes = Router()
    store, tenant = deps.store, deps.tenant

    @routes.put(
        "/agents/<name>/aliases/<alias>",
        summary="Point an alias at a version, or split it with a canary",
        description='One version (`{"versions": [{"version": 7, "weight": 100}]}`) or two whose weights sum to '
        "100 (the second is the canary). One conditional write: every version named must exist, else 422 naming "
        "it and nothing changes. New tasks submitted as `name@alias` get the new targets at once; a task already "
        "submitted keeps the version it was given. Rollback: point it back. The answer is the alias as this request "
        "wrote it, its `revision` this move's own. With `expected_revision` (the revision the caller read), it moves "
        "only if the alias is still there (0: only if it does not exist yet), else 409 `alias_conflict` naming "
        "`expected_revision` and nothing changes: a canary bump never undoes a rollback made since. With `online` "
        '(`{"rate": 0.1, "grade": {"rubric": "..."}}`), that fraction of its new tasks (by a hash of the task id) '
        "has its answer graded once, for each version's pass rate and cost (`GET /agents/{name}/quality`); the "
        "grade never changes how a task ends. A rate outside 0-1, a grade with neither rubric nor grader, an "
        "unknown grader: 422 naming the field, nothing written; setting the alias without `online` turns it off.",
        operation_id="setAgentAlias",
        tags=["agents"],
        responses=responses(200, AgentAlias, 400, 404, 409, 413, 415, 422),
    )
    def set_alias(
        name: AgentName, alias: AliasName, spec: Annotated[AliasRequest, Body(description="where it points")]
    ) -> AgentAlias:
        return control_aliases.set_alias(
            store, deps.tools, tenant(), name, alias, spec, expected_revision=spec.expected_revision
        )

    @routes.get(
        "/agents/<name>/aliases",
        summary="An agent's aliases",
        description="By alias name. An agent the caller's tenant does not have: 404 agent_not_found.",
        operation_id="listAgentAliases",
        tags=["agents"],
        responses=responses(200, AgentAliasList, 404, 422),
    )
    def list_aliases(name: AgentName) -> AgentAliasList:
        store.agents.latest(tenant(), name)  # an agent it does not have is 404, as its versions are
        return AgentAliasList(agent=name, aliases=store.aliases.list(tenant(), name))

    @routes.get(
        "/agents/<name>/aliases/<alias>",
        summary="One alias of an agent",
        operation_id="getAgentAlias",
        tags=["agents"],
        responses=responses(200, AgentAlias, 404, 422),
    )
    def get_alias(name: AgentName, alias: AliasName) -> AgentAlias:
        return store.aliases.get(tenant(), name, alias)

    @routes.delete(
        "/agents/<name>/aliases/<alias>",
        summary="Delete an alias",
        description="Tasks already submitted through it keep their versions; a submission naming it is then 422.",
        operation_id="deleteAgentAlias",
        tags=["agents"],
        responses=responses(200, AgentAlias, 404, 422),
    )
    def delete_alias(name: AgentName, alias: AliasName) -> AgentAlias:
        return store.aliases.delete(tenant(), name, alias)

    @routes.get(
        "/agents/<name>/quality",
        summary="An agent's pass rate and cost over time, per version (online evaluation)",
        description="The answers its aliases' online evaluation sampled and graded, counted per version and hour: "
        "graded, passed, errors (a grade that failed), unanswered (a sampled task that ended failed, timed_out, "
        "cost_exceeded or cancelled after it began to run: a fail of the pass rate), pass rate, mean score, the "
        "tasks' cost and the grading's cost apart. One query of counters (a few items a version an hour), never of "
        "the tasks. An agent the caller's tenant does not have: 404 agent_not_found.",
        operation_id="getAgentQuality",
        tags=["agents"],
        responses=responses(200, AgentQuality, 404, 422),
    )
    def quality(
        name: AgentName,
        hours: Annotated[int, Query(ge=1, le=MAX_HOURS, description="the last N hours, this one included")] = 48,
    ) -> AgentQuality:
        store.agents.latest(tenant(), name)  # 404 agent_not_found: not 200 with no buckets, as if never graded
        last = hour_of(time.time())
        first = last - hours + 1
        buckets = store.quality.read(tenant(), name, first, last)
        return AgentQuality(agent=name, first_hour=first, last_hour=last, buckets=buckets)

    @routes.post(
        "/tasks/<task_id>/agent",
        summary="Move a task to another version of its agent",
        description="A task keeps the version it was submitted with (an alias moved since changes nothing for it), "
        "follow-ups included. This moves it: from its next run it is what its request submitted to that version would "
        "be (the version's model, system, tools, policies, outcome, memory, callback, constraint defaults, ...), "
        "keeping what its submitter set itself (its own constraints, outcome, ...), its budget, workspace and "
        "conversation. Only an answered (`succeeded`) or `idle` task moves (409 otherwise); the stream logs "
        "`agent.moved`. A key's call: an end user's token is answered 403.",
        operation_id="moveTaskAgent",
        tags=["agents"],
        responses=responses(200, TaskMoved, 400, 403, 404, 409, 413, 415, 422),
    )
    def move(task_id: TaskId, body: Annotated[MoveRequest, Body(description="the version")]) -> TaskMoved:
        visible(deps, task_id)
        if deps.caller().bound:  # as its submission may not name a version by number (api.user_submission)
            raise Forbidden(
                "version: a user's token runs the version its tenant routed it to; moving a task to another "
                "version is the tenant's (its key's) to do",
                field="version",
            )
        previous, agent = move_task(store, deps.tools, task_id, body.version, tenant=tenant(), defaults=deps.defaults)
        return TaskMoved(task_id=task_id, previous=previous, agent=agent)

    return routes
