"""Creating agent versions, and resolving a submission that names one.

A version is checked against this deployment as a task would be (its tools exist, its model
is priced, its script loads) before it is stored, so a task of a stored version never fails
for what the version says. Resolution copies the version's fields into the submission and
pins ``agent`` to ``name@version``: the task then carries everything it runs with.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from agentq.control.aliases import aliased
from agentq.control.memory import check_attachments
from agentq.control.validation import (
    check_fallbacks,
    check_model,
    check_outcome,
    check_script,
    check_tools,
    parse_submission,
    validate_body,
)
from agentq.control.workspaces import check_workspace
from agentq.core.agents import (
    DEFINED_BY_AGENT,
    DEFINED_CONSTRAINTS,
    AgentSpec,
    AgentVersion,
    parse_ref,
    resolved_fields,
)
from agentq.core.errors import ValidationError
from agentq.core.models import MCP_SERVER_RULE, McpToolPin, TaskSubmission, usable_mcp_server_name
from agentq.core.providers.features import check_features
from agentq.core.tools import ToolRegistry
from agentq.core.tools.mcp import McpError, McpServers, valid_tool_name
from agentq.storage.agent_aliases import AliasNotFound
from agentq.storage.agents import AgentNotFound
from agentq.storage.container import Storage


def parse_agent_spec(raw: Any) -> AgentSpec:
    """Validate an agent definition; the error names the first bad field in dotted form."""
    return validate_body(AgentSpec, raw, what="the agent definition")


def check_agent(spec: AgentSpec, tools: ToolRegistry, mcp_tools: list[McpToolPin] | None = None) -> None:
    check_model(spec.provider, spec.model)
    thinking, effort = spec.constraints.thinking_budget_tokens, spec.constraints.effort
    check_features(spec.provider, spec.model, thinking=thinking, effort=effort)
    check_fallbacks(spec.fallbacks or [], thinking=thinking, effort=effort)
    names = [*spec.tools, *(p.qualified for p in mcp_tools or []), *(r.tool for r in spec.remote_agents or [])]
    if spec.remote_agents:
        from agentq.core.remote_agents import check_remote_agents

        check_remote_agents(spec.remote_agents)
    if spec.memory:  # its memory tools may be named too, to give one a policy (memory_write: ask)
        from agentq.core.tools.memory import memory_tools

        tools = tools.with_tools(memory_tools(spec.memory))
    check_tools(spec.tools, {}, tools, prefix="")
    for name in spec.tool_policies:
        if name not in names:
            raise ValidationError(
                f"tool_policies.{name}: a policy for a tool the agent may not use; its tools: {', '.join(names) or '(none)'}",
                field=f"tool_policies.{name}",
            )
    check_script(spec.script)
    check_outcome(spec.outcome, spec.provider, spec.model, tools)
    if spec.notify is not None:
        from agentq.core.webhooks import check_url

        check_url(spec.notify.url)


def pin_mcp_tools(spec: AgentSpec, servers: McpServers | None) -> list[McpToolPin]:
    """List the tools of each MCP server the agent names, now, keeping those it asks for.

    A task offers each tool under one name (``ToolRegistry.register`` refuses a second), so a
    pin whose name is taken is refused here, naming its server, rather than storing a version
    every task of which is refused: a server listing one tool twice (which copy's hints are
    true?), a server named twice, a deployment tool called ``mcp__...``; and a server name whose
    tools' names could be another server's (``usable_mcp_server_name``)."""
    pins: list[McpToolPin] = []
    offered = {name: f"tools[{j}]" for j, name in enumerate(spec.tools)}  # a tool's name -> its field
    for i, ref in enumerate(spec.mcp_servers):
        field = f"mcp_servers[{i}]"
        if not usable_mcp_server_name(ref.name):  # the stored form is looser: versions stored before stay readable
            raise ValidationError(f"{field}.name: {ref.name!r}: {MCP_SERVER_RULE}", field=f"{field}.name")
        if servers is None or ref.name not in servers.servers:
            registered = ", ".join(servers.names()) if servers else ""
            raise ValidationError(
                f"{field}.name: no MCP server {ref.name!r} in this deployment; registered: {registered or '(none)'}",
                field=f"{field}.name",
            )
        try:
            listed = servers.list_tools(ref.name)
        except McpError as exc:
            raise ValidationError(
                f"{field}: could not list its tools ({exc.message}); the version was not created", field=field
            ) from None
        by_name = {p.name: p for p in listed}
        listings = Counter(p.name for p in listed)
        for j, wanted in enumerate(ref.tools or []):
            if wanted not in by_name:
                raise ValidationError(
                    f"{field}.tools[{j}]: {ref.name!r} has no tool {wanted!r}; it has: {', '.join(sorted(by_name))}",
                    field=f"{field}.tools[{j}]",
                )
        chosen = [by_name[t] for t in dict.fromkeys(ref.tools)] if ref.tools is not None else listed
        for pin in chosen:
            if not valid_tool_name(pin):
                raise ValidationError(
                    f"{field}: tool {pin.name!r} cannot be offered to a model as {pin.qualified!r} "
                    "(letters, digits, '_' and '-', up to 64); leave it out with tools",
                    field=field,
                )
            if listings[pin.name] > 1:
                raise ValidationError(
                    f"{field}: {ref.name!r} lists tool {pin.name!r} {listings[pin.name]} times, so which of its "
                    "descriptions and hints is true is unknown; leave it out with tools",
                    field=field,
                )
            if pin.qualified in offered:
                raise ValidationError(
                    f"{field}: tool {pin.name!r} would be offered as {pin.qualified!r}, which "
                    f"{offered[pin.qualified]} already offers; a task's tools have one name each",
                    field=field,
                )
            offered[pin.qualified] = field
        pins += chosen
    return pins


def create_agent(
    store: Storage, tools: ToolRegistry, raw: Any, *, tenant: str, mcp: McpServers | None = None
) -> tuple[AgentVersion, bool]:
    """Validate fully (listing its MCP servers' tools), then store a new version (or find the
    latest is the same: created False)."""
    spec = raw if isinstance(raw, AgentSpec) else parse_agent_spec(raw)
    check_model(spec.provider, spec.model)
    pins = pin_mcp_tools(spec, mcp)
    check_agent(spec, tools, pins)
    check_attachments(store, spec.memory, tenant=tenant)
    check_workspace(store, spec.workspace, tenant=tenant)
    return store.agents.create(tenant, spec, pins)


def resolve_agent(
    store: Storage, submission: TaskSubmission, *, tenant: str, task_id: str | None = None
) -> TaskSubmission:
    """``submission`` with its agent's version filled in and pinned; a field the agent defines
    and the submission also sets is refused, naming the field. ``name@alias`` takes the version
    the alias gives this task (``core.aliases``: by its user, else by ``task_id``), and the
    alias's online grade when it samples the task."""
    assert submission.agent is not None
    name, version = parse_ref(submission.agent)
    for field in DEFINED_BY_AGENT:
        if field in submission.model_fields_set:
            raise ValidationError(
                f"{field}: set by agent {name!r}; leave it out, or create a new version of the agent", field=field
            )
    sent_constraints = (
        submission.constraints.model_fields_set if "constraints" in submission.model_fields_set else set()
    )
    for field in DEFINED_CONSTRAINTS:
        if field in sent_constraints:
            raise ValidationError(
                f"constraints.{field}: set by agent {name!r}; leave it out, or create a new version of the agent",
                field=f"constraints.{field}",
            )
    online = None
    try:
        if isinstance(version, str):
            found, online = aliased(store, tenant, name, version, task_id=task_id, user=submission.user)
        else:
            found = store.agents.get(tenant, name, version)
    except (AgentNotFound, AliasNotFound) as exc:  # in a submission, a bad field, not a missing resource
        raise ValidationError(f"agent: {exc.message}", field="agent") from None
    if (
        found.workspace is not None
        and submission.workspace is not None
        and "allow_hosts" in submission.workspace.model_fields_set
    ):
        raise ValidationError(
            f"workspace.allow_hosts: set by agent {name!r}; leave it out, or create a new version of the agent",
            field="workspace.allow_hosts",
        )
    if found.output_schema is not None and "output_schema" in submission.model_fields_set:
        raise ValidationError(
            f"output_schema: set by agent {name!r}; leave it out, or create a new version of the agent",
            field="output_schema",
        )
    sent = submission.model_dump(include=submission.model_fields_set - {"constraints", "agent"})
    sent["constraints"] = submission.constraints.model_dump(include=sent_constraints)
    if online is not None:  # sampled by its alias: graded once for the version's pass rate
        sent["online"] = online.model_dump(exclude_none=True)
    return parse_submission(resolved_fields(found, sent))
