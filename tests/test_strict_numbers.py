"""A number in a request body is a JSON number (issue 39, item 9): pydantic's lax mode took
``true`` for 1 (``max_steps: true`` ran a task of one turn) and ``"5"`` for 5.

Every integer and number field of every request body (found by walking each model's JSON
schema, so a field added later is covered) is given ``true``, ``false`` and a numeric string,
and must be refused naming that field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from agentq.api.errors import field_path
from agentq.api.mcp_server import AgentCall, TaskCheck, TaskMessage
from agentq.api.memory_models import MemoryWrite
from agentq.api.models import BudgetRequest, DecisionRequest, ForkRequest, MessageRequest
from agentq.core.agents import AgentSpec
from agentq.core.memory import MemoryStoreSpec, MemoryStoreUpdate
from agentq.core.models import TaskSubmission
from agentq.core.schedules import ScheduleSpec

from tests.api_support import SCRIPTED, ApiStack

# Every model a route or an MCP tool validates a JSON body with.
BODIES: list[type[BaseModel]] = [
    TaskSubmission, BudgetRequest, DecisionRequest, ForkRequest, MessageRequest, AgentSpec, MemoryStoreSpec,
    MemoryStoreUpdate, MemoryWrite, ScheduleSpec, AgentCall, TaskCheck, TaskMessage,
]  # fmt: skip
NOT_NUMBERS = [True, False, "5"]


def _numeric_fields(
    schema: dict[str, Any], defs: dict[str, Any], path: tuple[Any, ...] = ()
) -> Iterator[tuple[Any, ...]]:
    """The path of each integer or number in ``schema`` (a list's first item stands for all)."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    if schema.get("type") in ("integer", "number"):
        yield path
        return
    for member in schema.get("anyOf", []) + schema.get("oneOf", []):
        if member.get("type") == "string":
            continue  # a Decimal is number | string: its number member stands for it
        yield from _numeric_fields(member, defs, path)
    for name, sub in (schema.get("properties") or {}).items():
        yield from _numeric_fields(sub, defs, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from _numeric_fields(schema["items"], defs, (*path, 0))


def _cases() -> list[tuple[type[BaseModel], tuple[Any, ...]]]:
    out = []
    for model in BODIES:
        schema = model.model_json_schema()
        out += [(model, path) for path in dict.fromkeys(_numeric_fields(schema, schema.get("$defs", {})))]
    return out


CASES = _cases()


def _body(path: tuple[Any, ...], value: Any) -> Any:
    """A body holding ``value`` at ``path`` (and nothing else)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    return [_body(rest, value)] if isinstance(head, int) else {head: _body(rest, value)}


def _dotted(path: tuple[Any, ...]) -> str:
    return field_path(("body", *path)) or ""


def test_the_walk_finds_the_fields_the_issue_named() -> None:
    found = {(m.__name__, _dotted(p)) for m, p in CASES}
    assert {("TaskSubmission", "constraints.max_steps"), ("TaskSubmission", "script.turns[0].latency_seconds"),
            ("TaskSubmission", "concurrency.limit"), ("ForkRequest", "at_step"), ("BudgetRequest", "add_usd"),
            ("MemoryStoreSpec", "max_documents"), ("AgentCall", "wait_seconds")} <= found  # fmt: skip


@pytest.mark.parametrize(("model", "path"), CASES, ids=[f"{m.__name__}.{_dotted(p)}" for m, p in CASES])
def test_a_boolean_or_a_numeric_string_is_not_a_number_of_a_request_body(
    model: type[BaseModel], path: tuple[Any, ...]
) -> None:
    for value in NOT_NUMBERS:
        if value == "5" and _dotted(path).endswith("_usd"):
            continue  # money may be a decimal string: a float would round it
        with pytest.raises(ValidationError) as refused:
            model.model_validate(_body(path, value))
        named = {_dotted(tuple(e["loc"])) for e in refused.value.errors()}
        assert _dotted(path) in named, (value, named)


def test_max_steps_true_over_http_is_a_422_naming_it_and_creates_nothing(api_stack: ApiStack) -> None:
    before = len(api_stack.http("GET", "/tasks?limit=100")[1]["tasks"])
    for constraints in ({"max_steps": True}, {"max_tokens": False}, {"timeout_seconds": "60"}):
        status, body, _ = api_stack.http("POST", "/tasks", {**SCRIPTED, "constraints": constraints})
        field = f"constraints.{next(iter(constraints))}"
        assert status == 422 and body["error"]["field"] == field, (constraints, body)
    assert len(api_stack.http("GET", "/tasks?limit=100")[1]["tasks"]) == before
