"""The grading model's call holds the task tree's budget like any model call (ARCHITECTURE 4,
``used <= cap``): its input estimate plus its output allowance are held before it is sent, and
the grade's commit settles the hold to what it used. A budget that cannot cover the hold ends
the task ``cost_exceeded`` before the grading model is asked, the answer kept, and a raise
of the cap resumes it at the grade (tests/test_outcomes_processes.py kills workers mid-grade)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from agentq.control.operations import raise_budget
from agentq.control.submit import parse_submission
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import GradeStep, LLMStep, TaskStatus
from agentq.core.tenancy import TenantLimits
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq.storage.tenant_windows import TenantWindows

STORAGE = "memory"

# A long rubric: the grading model's call reads far more than the agent's answer costs.
RUBRIC = "The answer names a colour. " * 400
GRADE = {"turns": [{"text": '{"score": 1, "feedback": ""}'}]}


def _body(max_tokens: int) -> dict[str, Any]:
    return {
        "goal": "name a colour", "provider": "scripted", "script": {"turns": [{"text": "Blue."}]},
        "constraints": {"max_tokens": max_tokens, "max_output_tokens": 64},
        "outcome": {"rubric": RUBRIC, "script": GRADE, "max_output_tokens": 64},
    }  # fmt: skip


class _Queues:
    """Stands in for TaskQueues: a raise requeues the task; here the test runs it itself."""

    def send(self, task_id: str, priority: Any, **_: Any) -> None:
        pass


def _run(store: Storage, registry: ToolRegistry, max_tokens: int, tenant: str = "t") -> str:
    task = store.tasks.create(parse_submission(_body(max_tokens)), tenant=tenant)
    Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=10)).run(task.task_id)
    return task.task_id


def _measured(store: Storage, registry: ToolRegistry) -> tuple[int, int, int]:
    """(the agent's hold, the agent's usage, the grading call's usage) of a run with room to spare."""
    task_id = _run(store, registry, 1_000_000)
    steps = [s.body for s in store.steps.load(task_id)]
    (answer,) = [s for s in steps if isinstance(s, LLMStep)]
    (grade,) = [s for s in steps if isinstance(s, GradeStep)]
    assert store.tasks.get(task_id).status is TaskStatus.SUCCEEDED
    return answer.reserved_tokens, answer.usage.total, grade.usage.total


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.75, 0.99])
def test_a_cap_with_room_for_the_answer_but_not_the_grading_call_is_never_passed_and_keeps_the_answer(
    store: Storage, registry: ToolRegistry, fraction: float
) -> None:
    agent_hold, agent, grading = _measured(store, registry)
    assert agent_hold < agent + grading  # the grading call alone would take the tree past such caps
    cap = agent_hold + int(fraction * (agent + grading - agent_hold))
    task_id = _run(store, registry, cap)
    task = store.tasks.get(task_id)
    budget = store.budgets.get(task.budget_id)
    assert budget.used <= budget.cap == cap, budget
    assert budget.reserved == 0 and budget.unknown == 0, budget
    assert task.status is TaskStatus.COST_EXCEEDED, task
    assert task.error is not None and task.error["code"] == "budget_exceeded", task.error
    assert task.result == "Blue."  # the answer is kept
    assert [s.body.kind for s in store.steps.load(task_id)] == ["llm"]  # the grading model was never asked


def test_the_grading_calls_tokens_are_known_usage_once_and_its_hold_settled(
    store: Storage, registry: ToolRegistry
) -> None:
    _, agent, grading = _measured(store, registry)
    task_id = _run(store, registry, agent + grading + 10_000)
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.SUCCEEDED
    (grade,) = [s.body for s in store.steps.load(task_id) if isinstance(s.body, GradeStep)]
    assert grade.reserved_tokens >= grade.usage.total == grading > 0  # held before it was sent
    budget = store.budgets.get(task.budget_id)
    assert budget.used == budget.known == agent + grading, budget
    assert budget.reserved == 0 and budget.unknown == 0, budget
    assert budget.tokens_in + budget.tokens_out == agent + grading
    assert task.tokens_in + task.tokens_out == agent + grading
    assert task.inflight is None


def test_a_raise_of_the_cap_resumes_a_task_stopped_at_its_grade_and_grades_it(
    store: Storage, registry: ToolRegistry
) -> None:
    agent_hold, agent, grading = _measured(store, registry)
    task_id = _run(store, registry, agent_hold)
    assert store.tasks.get(task_id).status is TaskStatus.COST_EXCEEDED
    raised = raise_budget(store, cast(Any, _Queues()), task_id, add_tokens=grading + 10_000)
    assert raised.status is TaskStatus.QUEUED
    Engine(store, worker_id="w2", tools=registry, config=EngineConfig(lease_seconds=10)).run(task_id)
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.SUCCEEDED and task.result == "Blue."
    assert [s.body.kind for s in store.steps.load(task_id)] == ["llm", "grade"]
    budget = store.budgets.get(task.budget_id)
    assert budget.used == agent + grading <= budget.cap


def test_a_grading_call_abandoned_at_its_timeout_keeps_its_hold_counted_as_unknown_and_the_answer(
    store: Storage, registry: ToolRegistry
) -> None:
    body = _body(1_000_000)
    body["outcome"].update(timeout_seconds=1, script={"turns": [{"text": '{"score": 1}', "latency_seconds": 3}]})
    task = store.tasks.create(parse_submission(body), tenant="t")
    Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=10)).run(task.task_id)
    task = store.tasks.get(task.task_id)
    assert task.status is TaskStatus.FAILED_OUTCOME and task.result == "Blue."
    assert task.error is not None and task.error["code"] == "grader_timeout", task.error
    (grade,) = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, GradeStep)]
    assert grade.reserved_tokens > 0 and grade.usage.total == 0
    budget = store.budgets.get(task.budget_id)
    # The provider may have answered and billed it: counted at its hold, never returned on a guess.
    assert budget.unknown == grade.reserved_tokens and budget.reserved == 0, budget
    assert budget.used <= budget.cap
    assert task.inflight is None


def test_the_grading_call_holds_the_tenants_hour_too_and_settles_it_to_its_usage(
    store: Storage, registry: ToolRegistry
) -> None:
    agent_hold, agent, grading = _measured(store, registry)
    windows = TenantWindows(store.table)
    windows.set_limits("roomy", TenantLimits(hourly_tokens=1_000_000))
    task_id = _run(store, registry, 1_000_000, tenant="roomy")
    assert store.tasks.get(task_id).status is TaskStatus.SUCCEEDED
    assert windows.usage("roomy") == {"held": agent + grading, "used": agent + grading}  # settled, once
    # An hour with room for the answer but not the grading call's hold: the grader is not asked.
    windows.set_limits("tight", TenantLimits(hourly_tokens=agent_hold + grading // 2))
    task_id = _run(store, registry, 1_000_000, tenant="tight")
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.RUNNING and task.inflight is None  # handed back: tried again next hour
    assert [s.body.kind for s in store.steps.load(task_id)] == ["llm"]
    assert windows.usage("tight") == {"held": agent, "used": agent}
    assert store.budgets.get(task_id).reserved == 0
