"""Agent definitions: a named, versioned recipe (model, system prompt, tools, their policies,
constraint defaults) that a submission names instead of spelling it out.

Versions are immutable and numbered from 1 per tenant and name. A submission that names
``"researcher"`` gets the latest version, ``"researcher@3"`` that one; either way the task
stores the version it resolved to, pinned (``agent: "researcher@3"``) along with the fields
copied from it, so a resume, a retry or a fork runs exactly what the first run ran, whatever
versions are created later. What the agent defines a submission may not also set: two
sources for one field would leave a reader guessing which one ran.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

from agentq.core.memory import MemoryAttachment, merged_attachments
from agentq.core.models import (
    AGENT_REF_PATTERN,
    DEFAULT_MODEL,
    MCP_SERVER_PATTERN,
    ApprovalDefault,
    Concurrency,
    Effort,
    McpToolPin,
    Notify,
    OutcomeSpec,
    Provider,
    RemoteAgentRef,
    Script,
    StrictModel,
)
from agentq.core.models.constraints import (
    APPROVAL_TIMEOUT_SECONDS_BOUNDS,
    MAX_DEPTH_BOUNDS,
    MAX_FANOUT_BOUNDS,
    MAX_OUTPUT_TOKENS_BOUNDS,
    MAX_STEPS_BOUNDS,
    MAX_TOKENS_BOUNDS,
    THINKING_BUDGET_TOKENS_BOUNDS,
    TIMEOUT_SECONDS_BOUNDS,
    ToolNames,
    ToolPolicies,
)
from agentq.core.models.submission import (
    Fallbacks,
    MemoryAttachments,
    ModelName,
    OutputSchema,
    SystemPrompt,
    check_model_choice,
)
from agentq.core.workspace import WorkspaceSpec

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
MAX_DESCRIPTION_CHARS = 1024
# Fields of a submission the agent defines; a submission naming an agent may not set them.
DEFINED_BY_AGENT = ("provider", "model", "system", "script", "mcp_tools", "remote_agents", "fallbacks")
DEFINED_CONSTRAINTS = ("tools", "tool_policies")
# Fields a version gives its tasks that a submission may set itself: its own wins (a memory
# attachment per store, a constraint per name). A task records which it set
# (``TaskSubmission.own_fields``), so a move to another version keeps those and takes the rest
# from the new version (``control.aliases.move_task``).
SUPPLIED_BY_AGENT = ("outcome", "notify", "concurrency", "output_schema", "workspace")


class AgentConstraints(StrictModel):
    """Defaults for a task of this agent; a submission's own constraint wins, a deployment's
    default fills only what neither sets. Strict: a JSON ``true`` is not a number here."""

    # (Not in the docstring, which is the schema's description.) Each is bounded by the bound
    # ``Constraints`` declares for it (``core.models.constraints``): one declaration for both.

    model_config = ConfigDict(extra="forbid", strict=True)

    max_tokens: Annotated[int | None, MAX_TOKENS_BOUNDS] = None
    max_steps: Annotated[int | None, MAX_STEPS_BOUNDS] = None
    timeout_seconds: Annotated[int | None, TIMEOUT_SECONDS_BOUNDS] = None
    max_output_tokens: Annotated[int | None, MAX_OUTPUT_TOKENS_BOUNDS] = None
    max_depth: Annotated[int | None, MAX_DEPTH_BOUNDS] = None
    max_fanout: Annotated[int | None, MAX_FANOUT_BOUNDS] = None
    approval_timeout_seconds: Annotated[int | None, APPROVAL_TIMEOUT_SECONDS_BOUNDS] = None
    approval_default: ApprovalDefault | None = None
    thinking_budget_tokens: Annotated[int | None, THINKING_BUDGET_TOKENS_BOUNDS] = None
    effort: Effort | None = None


class McpServerRef(StrictModel):
    """An MCP server of the deployment an agent uses, and which of its tools (all if unset)."""

    name: str = Field(pattern=MCP_SERVER_PATTERN, description="a server registered in AGENTQ_MCP_SERVERS")
    tools: list[str] | None = Field(default=None, max_length=128, description="only these of its tools")


class AgentSpec(StrictModel):
    """What a caller sends to ``POST /agents``: a new version of ``name`` when it differs from
    the latest one."""

    name: str = Field(pattern=NAME_PATTERN, description="lowercase letters, digits, '-' and '_'; 1-64")
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS)
    provider: Provider = "anthropic"
    model: ModelName = DEFAULT_MODEL
    system: SystemPrompt = None
    script: Script | str | None = Field(
        default=None, description="scripted provider only: an inline script or a built-in script name"
    )
    tools: ToolNames = Field(default_factory=list, description="the tools its tasks may use")
    tool_policies: ToolPolicies = Field(
        default_factory=dict,
        description="per tool of `tools`: allow (default), ask (a person decides each call, the task's end user's "
        "token too), ask_tenant (only the tenant's API keys decide) or deny",
    )
    constraints: AgentConstraints = Field(default_factory=AgentConstraints)
    mcp_servers: list[McpServerRef] = Field(
        default_factory=list, max_length=16, description="MCP servers whose tools (listed now, pinned) it may use"
    )
    # None when unset: versions made before remote agents existed keep their digest.
    remote_agents: list[RemoteAgentRef] | None = Field(
        default=None,
        max_length=16,
        description="remote A2A agents it may delegate to, each a tool a2a__<name> (docs/PROTOCOLS.md)",
    )
    output_schema: OutputSchema = Field(
        default=None, description="a JSON Schema every final answer of its tasks must validate against"
    )
    notify: Notify | None = Field(
        default=None, description="the callback of its tasks' ends (a submission's own notify takes precedence)"
    )
    concurrency: Concurrency | None = Field(
        default=None,
        description="the concurrency key of its tasks (a submission's own takes precedence): e.g. limit 1 for an "
        "agent that schedules or webhooks start and that must not run twice at once",
    )
    memory: MemoryAttachments = Field(
        default_factory=list,
        description="memory stores its tasks may use; a submission may attach more, or attach one of these otherwise",
    )

    # None, not []: a version's digest is its JSON without None fields, so versions made before
    # fallbacks existed keep theirs.
    fallbacks: Fallbacks | None = Field(default=None, description="models its tasks fall back to, in order")
    # None when unset, like fallbacks: versions made before agents could carry a workspace keep
    # their digest.
    workspace: WorkspaceSpec | None = Field(
        default=None,
        description="its tasks' workspace: the hosts their shell may reach (a submission may not add any) and "
        "starting files (files, an upload or a git repository), used when the submission names none",
    )

    # None when unset: versions made before outcomes existed keep their digest.
    outcome: OutcomeSpec | None = Field(
        default=None,
        description="what its tasks must achieve (a rubric and/or a @grader), graded when they answer; a "
        "submission's own outcome takes precedence",
    )

    @model_validator(mode="after")
    def _consistent(self) -> AgentSpec:
        check_model_choice(self.provider, self.model, self.script, self.fallbacks or [])
        return self

    def digest(self, mcp_tools: list[McpToolPin] | None = None) -> str:
        """What makes two versions the same: every field, and the MCP tools pinned for it."""
        pinned = "".join(p.model_dump_json() for p in mcp_tools or [])
        # Without memory stores, the digest a version had before agents could attach any: the
        # same file applied again after an upgrade is still the same version.
        body = self.model_dump_json(exclude_none=True, exclude=None if self.memory else {"memory"})
        return hashlib.sha256((body + pinned).encode()).hexdigest()


class AgentVersion(AgentSpec):
    """One immutable version of an agent, as stored and as the API returns it."""

    version: int = Field(ge=1)
    created_at: float
    ref: str = Field(description="name@version: what a task of this version records")
    mcp_tools: list[McpToolPin] = Field(
        default_factory=list, description="the MCP servers' tools as listed when this version was created"
    )

    @classmethod
    def of(
        cls, spec: AgentSpec, version: int, created_at: float, mcp_tools: list[McpToolPin] | None = None
    ) -> AgentVersion:
        return cls.model_validate(
            {
                **spec.model_dump(),
                "version": version,
                "created_at": created_at,
                "ref": f"{spec.name}@{version}",
                "mcp_tools": [p.model_dump() for p in mcp_tools or []],
            }
        )

    def tool_names(self) -> list[str]:
        """Every tool a task of this version may use: its own, its MCP tools, its remote agents."""
        return [*self.tools, *(p.qualified for p in self.mcp_tools), *(r.tool for r in self.remote_agents or [])]

    def spec(self) -> AgentSpec:
        return AgentSpec.model_validate(self.model_dump(include=set(AgentSpec.model_fields)))


class AgentSummary(StrictModel):
    """One agent in a tenant's listing: its latest version."""

    name: str
    latest_version: int
    description: str | None = None
    updated_at: float


def parse_ref(ref: str) -> tuple[str, int | str | None]:
    """``"researcher"`` -> ("researcher", None: the latest); ``"researcher@3"`` -> ("researcher", 3);
    ``"researcher@prod"`` -> ("researcher", "prod": an alias, ``core.aliases``)."""
    if not re.fullmatch(AGENT_REF_PATTERN, ref):  # not match: `$` passes a trailing newline
        raise ValueError("name, name@version or name@alias, e.g. researcher, researcher@3 or researcher@prod")
    name, _, after = ref.partition("@")
    if not after:
        return name, None
    return name, int(after) if after.isdigit() else after


def agent_workspace(agent: WorkspaceSpec, sent: dict[str, Any] | None) -> dict[str, Any]:
    """A task's workspace under an agent that defines one: the agent's hosts; the submission's
    starting files if it names any, else the agent's; the submission's limits where it sets them,
    else the agent's (``resolve_agent`` has refused a submission that names hosts of its own)."""
    own = WorkspaceSpec.model_validate(sent) if sent is not None else None
    start = own if own is not None and own.sources() else agent
    limits = {"max_bytes", "max_files"}
    fields = start.model_dump(exclude_none=True, exclude={"allow_hosts", *limits})
    for name in limits:
        value = getattr(own, name) if own is not None and getattr(own, name) is not None else getattr(agent, name)
        if value is not None:
            fields[name] = value
    return {**fields, "allow_hosts": list(agent.allow_hosts)}


def own_fields(sent: dict[str, Any]) -> list[str]:
    """What of the fields a version also gives its tasks ``sent`` sets itself (a field sent as
    null included: it drops the version's), as ``TaskSubmission.own_fields`` records it."""
    names = [name for name in SUPPLIED_BY_AGENT if name in sent]
    names += [f"constraints.{name}" for name in sent.get("constraints") or {}]
    names += [f"memory.{MemoryAttachment.model_validate(a).store}" for a in sent.get("memory") or []]
    return sorted(names)


def resolved_fields(version: AgentVersion, submission_fields: dict[str, Any]) -> dict[str, Any]:
    """The fields of a submission of ``version``: the agent's, then the submission's own
    constraints over the agent's defaults; ``agent`` pinned to the version; which fields the
    submission set itself recorded (``own_fields``)."""
    sent = dict(submission_fields)
    recorded = own_fields(sent)
    sent_constraints = dict(sent.pop("constraints", None) or {})
    agent_defaults = version.constraints.model_dump(exclude_none=True)
    constraints = {
        **agent_defaults,
        **sent_constraints,
        "tools": version.tool_names(),
        "tool_policies": dict(version.tool_policies),
    }
    fields: dict[str, Any] = {
        **sent,
        "agent": version.ref,
        "provider": version.provider,
        "model": version.model,
        "constraints": constraints,
        "mcp_tools": [p.model_dump() for p in version.mcp_tools],
        "remote_agents": [r.model_dump(exclude_none=True) for r in version.remote_agents or []],
        "own_fields": recorded,
    }
    if version.memory:
        own = [MemoryAttachment.model_validate(a) for a in sent.get("memory") or []]
        fields["memory"] = [a.model_dump(exclude_none=True) for a in merged_attachments(version.memory, own)]
    if version.fallbacks:
        fields["fallbacks"] = [f.model_dump() for f in version.fallbacks]
    if version.output_schema is not None:
        fields["output_schema"] = version.output_schema
    if version.notify is not None and "notify" not in sent:
        fields["notify"] = version.notify.model_dump()
    if version.outcome is not None and "outcome" not in sent:
        fields["outcome"] = version.outcome.model_dump(exclude_none=True)
    if version.workspace is not None:
        fields["workspace"] = agent_workspace(version.workspace, sent.get("workspace"))
    if version.concurrency is not None and "concurrency" not in sent:
        fields["concurrency"] = version.concurrency.model_dump()
    if version.system is not None:
        fields["system"] = version.system
    if version.script is not None:
        fields["script"] = version.script if isinstance(version.script, str) else version.script.model_dump()
    return fields
