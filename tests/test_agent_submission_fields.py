"""What an agent defines and a submission may spell out itself (model, system prompt, script,
fallbacks, output schema, memory stores, tools and their policies, the constraint defaults) is
declared once (``core.models.submission``, ``core.models.constraints``) and both models use it:
a value one refuses the other refuses, with the same error, so an agent version never holds a
value its tasks would be refused for, nor the reverse."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from agentq.core.agents import AgentSpec
from agentq.core.models import TaskSubmission

SCRIPTED = {"provider": "scripted", "script": "echo"}
ANTHROPIC = {"provider": "anthropic", "script": None}
FALLBACK = {"provider": "openai", "model": "m"}

# Each bad value of a shared field, with the provider it is sent with.
BAD_FIELDS: list[dict[str, Any]] = [
    {**SCRIPTED, "model": ""},
    {**SCRIPTED, "model": "x" * 201},
    {**SCRIPTED, "system": "x" * 20_001},
    {**SCRIPTED, "system": 5},
    {**SCRIPTED, "memory": [{"store": "a"}, {"store": "a"}]},
    {**SCRIPTED, "memory": [{"store": f"s{i}"} for i in range(40)]},
    {**SCRIPTED, "output_schema": {"type": "nope"}},
    {**SCRIPTED, "output_schema": 3},
    {**ANTHROPIC, "fallbacks": [FALLBACK, FALLBACK]},
    {**ANTHROPIC, "fallbacks": [{"provider": "openai", "model": str(i)} for i in range(5)]},
    {**ANTHROPIC, "model": "m1", "fallbacks": [{"provider": "anthropic", "model": "m1"}]},
    {**SCRIPTED, "fallbacks": [FALLBACK]},
    {"provider": "anthropic", "script": "echo"},
    {"provider": "scripted", "script": None},
    {**SCRIPTED, "tools": ["a", "a"]},
    {**SCRIPTED, "tools": [str(i) for i in range(65)]},
    {**SCRIPTED, "tool_policies": {str(i): "ask" for i in range(65)}},
    {**SCRIPTED, "tool_policies": {"a": "maybe"}},
]
# Each bad default of a constraint an agent may default.
BAD_CONSTRAINTS: list[dict[str, Any]] = [
    {"max_tokens": 0},
    {"max_tokens": 1_000_000_001},
    {"max_tokens": 1.0},
    {"max_steps": True},
    {"max_steps": "5"},
    {"max_steps": 10_001},
    {"timeout_seconds": 86_401},
    {"max_output_tokens": 128_001},
    {"max_depth": -1},
    {"max_fanout": 101},
    {"approval_timeout_seconds": 0},
    {"approval_default": "maybe"},
    {"thinking_budget_tokens": 1023},
    {"effort": "huge"},
]


def _errors(model: type[BaseModel], body: dict[str, Any]) -> list[tuple[tuple[Any, ...], str, str]]:
    """What ``model`` says of ``body``, each error's place said without the model's own nesting
    (a submission's tools sit in its constraints, an agent's at the top)."""
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body)
    return [(tuple(p for p in e["loc"] if p != "constraints"), e["msg"], e["type"]) for e in refused.value.errors()]


@pytest.mark.parametrize("fields", BAD_FIELDS)
def test_an_agent_and_a_submission_refuse_a_shared_fields_bad_value_alike(fields: dict[str, Any]) -> None:
    body = dict(fields)
    tools: dict[str, Any] = {k: body.pop(k) for k in ("tools", "tool_policies") if k in body}
    agent = _errors(AgentSpec, {"name": "a", **body, **tools})
    submission = _errors(TaskSubmission, {"goal": "g", **body, "constraints": tools})
    assert agent == submission


@pytest.mark.parametrize("constraint", BAD_CONSTRAINTS)
def test_an_agents_constraint_default_is_refused_as_the_tasks_own_value_is(constraint: dict[str, Any]) -> None:
    agent = _errors(AgentSpec, {"name": "a", **SCRIPTED, "constraints": constraint})
    submission = _errors(TaskSubmission, {"goal": "g", **SCRIPTED, "constraints": constraint})
    assert agent == submission


def test_good_values_of_the_shared_fields_pass_both() -> None:
    fields = {
        **ANTHROPIC,
        "model": "m1",
        "system": "be brief",
        "fallbacks": [FALLBACK],
        "output_schema": {"type": "object"},
        "memory": [{"store": "a"}, {"store": "b"}],
    }
    constraints = {"max_steps": 3, "max_depth": 0, "thinking_budget_tokens": 1024, "effort": "high"}
    agent = AgentSpec.model_validate({"name": "a", **fields, "constraints": constraints, "tools": ["x"]})
    submission = TaskSubmission.model_validate({"goal": "g", **fields, "constraints": {**constraints, "tools": ["x"]}})
    shared = set(fields) - {"script"}
    assert agent.model_dump(include=shared) == submission.model_dump(include=shared)
    assert agent.constraints.model_dump(exclude_none=True) == submission.constraints.model_dump(
        include=set(constraints)
    )
