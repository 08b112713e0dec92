"""Structured final output: a task with an ``output_schema`` ends only with an answer that
validates. The model answers through ``final_answer``; an invalid answer (as the tool's input or
as text) is shown to the model with the validation error and it tries again within its budget;
``/result`` returns the answer as JSON; a schema that cannot work is refused at submission. The
engine's tests run on the in-memory twin of the table; ``/result`` on the local stack."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentq.control.submit import parse_submission
from agentq.core.engine import Engine, EngineConfig, conversation
from agentq.core.errors import ValidationError
from agentq.core.models import LLMStep, TaskStatus, ToolsStep
from agentq.core.output import FINAL_ANSWER_TOOL
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.api_support import ApiStack
from tests.helpers import call

SCHEMA = {
    "type": "object",
    "properties": {"total": {"type": "integer", "minimum": 0}, "currency": {"enum": ["EUR", "USD"]}},
    "required": ["total", "currency"],
    "additionalProperties": False,
}


# The engine's own behaviour needs no AWS. ``store`` and ``registry`` (tests/conftest.py) are the in-memory twin's;
# tests that race processes or use queues ask for ``settings`` and build their own.
STORAGE = "memory"


def _task(turns: list[dict[str, Any]], schema: dict[str, Any] = SCHEMA) -> dict[str, Any]:
    return {"goal": "sum the invoices", "provider": "scripted", "script": {"turns": turns}, "output_schema": schema,
            "constraints": {"tools": ["lookup"]}}  # fmt: skip


def test_invalid_answers_are_sent_back_with_the_error_until_one_validates(
    store: Storage, registry: ToolRegistry
) -> None:
    turns: list[dict[str, Any]] = [
        {"text": "The total is 42 euros."},  # text, not JSON: the next request says why
        {"text": "", "tool_calls": [call(FINAL_ANSWER_TOOL, answer={"total": "many", "currency": "EUR"})]},
        {"text": "", "tool_calls": [call(FINAL_ANSWER_TOOL, answer={"total": 42, "currency": "EUR"})]},
        {"text": "never reached"},
    ]
    task = store.tasks.create(parse_submission(_task(turns)), tenant="t")
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=10))
    result = engine.run(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED
    final = store.tasks.get(task.task_id)
    assert json.loads(final.result or "") == {"total": 42, "currency": "EUR"}

    steps = store.steps.load(task.task_id)
    assert [s.body.kind for s in steps] == ["llm", "llm", "tools", "llm"]
    rejected = steps[2].body
    assert isinstance(rejected, ToolsStep) and rejected.results[0].is_error
    assert "total: 'many' is not of type 'integer'" in rejected.results[0].content
    # The feedback after the text answer is rebuilt from the stored step, the same on every resume.
    messages = conversation(task.submission.goal, steps[:1], SCHEMA)
    assert messages[-1]["role"] == "user" and "it is not JSON" in messages[-1]["content"]
    assert conversation(task.submission.goal, steps, SCHEMA)[2] == messages[-1]
    assert sum(isinstance(s.body, LLMStep) for s in steps) == 3  # each try is a turn of the budget


def test_a_valid_answer_given_as_text_ends_the_task(store: Storage, registry: ToolRegistry) -> None:
    turns = [{"text": '```json\n{"total": 7, "currency": "USD"}\n```'}]
    task = store.tasks.create(parse_submission(_task(turns)), tenant="t")
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=10))
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    assert json.loads(store.tasks.get(task.task_id).result or "") == {"total": 7, "currency": "USD"}


def test_a_task_that_never_validates_stops_at_its_step_cap(store: Storage, registry: ToolRegistry) -> None:
    body = _task([{"text": "no idea"}] * 5)
    body["constraints"]["max_steps"] = 3
    task = store.tasks.create(parse_submission(body), tenant="t")
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=10))
    assert engine.run(task.task_id).status is TaskStatus.COST_EXCEEDED


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "objekt"}, "not a valid JSON Schema"),
        ({"properties": {"n": {"minimum": "zero"}}}, "not a valid JSON Schema at properties/n/minimum"),
    ],
)
def test_a_schema_that_cannot_work_is_refused_naming_the_field(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_submission(_task([{"text": "x"}], schema))
    assert refused.value.field == "output_schema" and message in refused.value.message


def test_the_api_returns_the_answer_as_json_and_refuses_a_bad_schema(api_stack: ApiStack) -> None:
    turns = [{"text": "", "tool_calls": [call(FINAL_ANSWER_TOOL, answer={"total": 3, "currency": "EUR"})]}]
    task_id = api_stack.submit(_task(turns))
    api_stack.until(task_id, lambda v: v["status"] == "succeeded")
    status, result, _ = api_stack.http("GET", f"/tasks/{task_id}/result")
    assert status == 200 and result["output"] == {"total": 3, "currency": "EUR"}
    status, refused, _ = api_stack.http("POST", "/tasks", _task(turns, {"type": 5}))
    assert status == 422 and refused["error"]["field"] == "output_schema"
