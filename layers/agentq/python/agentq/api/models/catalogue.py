"""What a tenant defines once and reuses: its agents' versions, its schedules, its callback
secret."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from agentq.api.models.base import (
    ApiModel,
)
from agentq.core.agents import AgentSummary, AgentVersion
from agentq.core.aliases import AgentAlias
from agentq.core.models.strict import StrictModel
from agentq.core.quality import QualityBucket


class AgentCreated(ApiModel):
    created: bool = Field(description="false: the latest version already was this definition")
    agent: AgentVersion


class AgentList(ApiModel):
    agents: list[AgentSummary]


class AgentAliasList(ApiModel):
    agent: str
    aliases: list[AgentAlias] = Field(description="by alias name")


class AgentQuality(ApiModel):
    """An agent's online grades per version and hour (``GET /agents/{name}/quality``)."""

    agent: str
    first_hour: int = Field(description="the first hour read (hours since the epoch)")
    last_hour: int = Field(description="the last hour read, this one")
    buckets: list[QualityBucket] = Field(description="by hour, then version; an hour without a grade has none")


class MoveRequest(StrictModel):
    """Move a task to another version of its agent (``POST /tasks/{id}/agent``). Strict, as every
    request body: read leniently, ``{"version": 2, "keep_outcome": true}`` moved the task and
    dropped the field the caller believed it set."""

    version: int = Field(strict=True, ge=1, le=999_999_999, description="a version of the task's agent")


class TaskMoved(ApiModel):
    task_id: str
    previous: str = Field(description="the version it ran: name@N")
    agent: str = Field(description="the version its next run runs: name@M")


class AgentVersions(ApiModel):
    name: str
    versions: list[AgentVersion] = Field(description="newest first")
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= for the next page; null at the end")


class WebhookSecret(ApiModel):
    secret: str = Field(description="the HMAC-SHA256 key of this tenant's callbacks")


class ScheduleView(ApiModel):
    name: str
    expression: str
    overlap: Literal["skip", "allow"]
    submission: dict[str, Any]
    created_at: float
    next_fire_at: float = Field(
        description="when it fires next (UTC seconds): moved on by each fire, in AWS as in agentq dev"
    )
    last_task_id: str | None
    fired: int = Field(description="fires that submitted a task")
    skipped: int = Field(description="fires skipped by the overlap policy or a stopped scope")
    failed: int = Field(
        0,
        description="fires whose stored submission was refused (an agent or alias it names deleted, a field "
        "that no longer validates): no task, the fire's message dead-lettered with the reason",
    )
    last_error: str | None = Field(
        None, description="why the latest failed fire was refused; cleared by a fire that submits"
    )


class ScheduleList(ApiModel):
    schedules: list[ScheduleView] = Field(description="by name")
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= for the next page; null at the end")
