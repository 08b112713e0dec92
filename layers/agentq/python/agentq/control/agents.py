"""Creating agent versions, and resolving a submission that names one.

A version is checked against this deployment as a task would be (its tools exist, its model
is priced, its script loads) before it is stored, so a task of a stored version never fails
for what the version says. Resolution copies the version's fields into the submission and
pins ``agent`` to ``name@version``: the task then carries everything it runs with.
"""

from __future__ import annotations

from typing import Any

from agentq.control.submit import check_model, check_script, check_tools, parse_submission, validate_body
from agentq.core.agents import (
    DEFINED_BY_AGENT,
    DEFINED_CONSTRAINTS,
    AgentSpec,
    AgentVersion,
    parse_ref,
    resolved_fields,
)
from agentq.core.errors import ValidationError
from agentq.core.models import TaskSubmission
from agentq.core.tools import ToolRegistry
from agentq.storage.agents import AgentNotFound
from agentq.storage.container import Storage


def parse_agent_spec(raw: Any) -> AgentSpec:
    """Validate an agent definition; the error names the first bad field in dotted form."""
    return validate_body(AgentSpec, raw, what="the agent definition")


def check_agent(spec: AgentSpec, tools: ToolRegistry) -> None:
    check_model(spec.provider, spec.model)
    check_tools(spec.tools, spec.tool_policies, tools, prefix="")
    check_script(spec.script)


def create_agent(store: Storage, tools: ToolRegistry, raw: Any, *, tenant: str) -> tuple[AgentVersion, bool]:
    """Validate fully, then store a new version (or find the latest is the same: created False)."""
    spec = raw if isinstance(raw, AgentSpec) else parse_agent_spec(raw)
    check_agent(spec, tools)
    return store.agents.create(tenant, spec)


def resolve_agent(store: Storage, submission: TaskSubmission, *, tenant: str) -> TaskSubmission:
    """``submission`` with its agent's version filled in and pinned; a field the agent defines
    and the submission also sets is refused, naming the field."""
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
    try:
        found = store.agents.get(tenant, name, version)
    except AgentNotFound as exc:  # in a submission, a bad field, not a missing resource
        raise ValidationError(f"agent: {exc.message}", field="agent") from None
    sent = submission.model_dump(include=submission.model_fields_set - {"constraints", "agent"})
    sent["constraints"] = submission.constraints.model_dump(include=sent_constraints)
    return parse_submission(resolved_fields(found, sent))
