"""The grading model's call is a model call like any other for the policy rules (ARCHITECTURE
14, docs/POLICIES.md): it is checked with kind ``model`` before anything of the grade is held or
begun, against ``Model::"<grading model>"`` with its hold as the estimate. A rule that denies it
(or asks for it: a model call cannot wait for approval) ends the task ``failed`` with
``policy_denied`` naming the rule, as a denied agent's call does, the answer kept as the
task's result and ungraded; a sampled task's online grade is skipped instead, naming the rule,
and the task ends as it would. A ``log_only`` rule changes nothing and is recorded. On the
in-memory twin; tests/test_policies.py runs the denial on the local stack's worker processes."""

from __future__ import annotations

from typing import Any

import pytest

from agentq import observe
from agentq.control.submit import parse_submission
from agentq.core.engine import Engine, EngineConfig, RunResult
from agentq.core.models import GradeStep, LLMStep, TaskStatus, TaskSubmission
from agentq.core.policies import check
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

STORAGE = "memory"

RUBRIC = "The answer names a colour. " * 400  # the grading call's hold: thousands of tokens
JUDGE = "judge-1"  # the grading model (the agent's is the scripted default)
GRADE = {"rubric": RUBRIC, "model": JUDGE, "script": {"turns": [{"text": '{"score": 1, "feedback": ""}'}]},
         "max_output_tokens": 64}  # fmt: skip

RULES = {
    "the grading model": f"""@id("no-judge") @message("the judge model is switched off")
        forbid(principal, action == Action::"model", resource == Model::"{JUDGE}");""",
    "a model call's estimate": """@id("no-big-calls") @message("no model call above 1000 tokens")
        forbid(principal, action == Action::"model", resource) when { context.call.estimated_tokens > 1000 };""",
    "ask": f"""@id("ask-judge") @effect("ask") @message("a person approves each grade")
        forbid(principal, action == Action::"model", resource == Model::"{JUDGE}");""",
}


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "goal": "name a colour", "provider": "scripted", "script": {"turns": [{"text": "Blue."}]},
        "constraints": {"max_tokens": 1_000_000, "max_output_tokens": 64}, "outcome": GRADE, **extra,
    }  # fmt: skip


def _rules(store: Storage, text: str) -> None:
    store.policies.put("t", "tenant", text, check(text).digest)


def _run(store: Storage, registry: ToolRegistry, task_id: str) -> RunResult:
    config = EngineConfig(lease_seconds=10, policy_cache_seconds=0)
    return Engine(store, worker_id="w", tools=registry, config=config).run(task_id)


def _kinds(store: Storage, task_id: str) -> list[str]:
    return [s.body.kind for s in store.steps.load(task_id)]


def _answer_tokens(store: Storage, task_id: str) -> int:
    return sum(s.body.usage.total for s in store.steps.load(task_id) if isinstance(s.body, LLMStep))


@pytest.mark.parametrize("rule", RULES)
def test_a_rule_that_denies_the_grading_model_call_stops_it_and_the_task_fails_naming_the_rule_answer_kept(
    store: Storage, registry: ToolRegistry, rule: str
) -> None:
    _rules(store, RULES[rule])
    task_id = store.tasks.create(parse_submission(_body()), tenant="t").task_id
    result = _run(store, registry, task_id)

    task = store.tasks.get(task_id)
    assert result.status is TaskStatus.FAILED and task.status is TaskStatus.FAILED, (result, task.error)
    rule_id = RULES[rule].split('"')[1]
    assert task.error is not None and task.error["code"] == "policy_denied", task.error
    assert task.error["message"].startswith("grading model call ") and f"tenant/{rule_id}" in task.error["message"]
    assert task.error["policy"]["rule"] == f"tenant/{rule_id}"
    if rule == "ask":
        assert "cannot wait for approval" in task.error["message"]
        assert store.approvals.pending(task_id) is None
    assert task.result == "Blue."  # the answer is kept, ungraded
    assert _kinds(store, task_id) == ["llm"]  # the agent's own call was allowed; the grader was never asked
    assert store.effects.get(task_id, "grade-2") is None  # nor the grade begun
    budget = store.budgets.get(task.budget_id)
    assert budget.used == budget.known == _answer_tokens(store, task_id), budget  # nothing held or spent for it
    assert budget.reserved == 0 and budget.unknown == 0 and task.inflight is None


def test_a_log_only_rule_over_the_grading_model_changes_nothing_and_records_what_it_would_have_decided(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[dict[str, Any]] = []
    real = observe.emit_event

    def emit(kind: str, detail: dict[str, Any], **kw: Any) -> None:
        events.append({"event": kind, **detail})
        real(kind, detail, **kw)

    monkeypatch.setattr(observe, "emit_event", emit)
    _rules(store, RULES["the grading model"].replace("@message", '@mode("log_only") @message'))
    task_id = store.tasks.create(parse_submission(_body()), tenant="t").task_id
    assert _run(store, registry, task_id).status is TaskStatus.SUCCEEDED
    assert _kinds(store, task_id) == ["llm", "grade"]
    (seen,) = [e for e in events if e["event"] == "PolicyDecision"]  # the agent's call matched no rule
    assert (seen["kind"], seen["model"], seen["step"], seen["decision"]) == ("model", JUDGE, 2, "allow")
    assert [h["rule"] for h in seen["log_only"]] == ["tenant/no-judge"]


def test_a_rule_that_denies_an_online_grades_call_skips_the_grade_naming_it_and_the_task_still_succeeds(
    store: Storage, registry: ToolRegistry
) -> None:
    _rules(store, RULES["the grading model"])
    body = _body()
    body["online"] = {"alias": "prod", "grade": body.pop("outcome")}
    task_id = store.tasks.create(TaskSubmission.model_validate(body), tenant="t").task_id
    result = _run(store, registry, task_id)
    task = store.tasks.get(task_id)
    assert result.status is TaskStatus.SUCCEEDED and task.result == "Blue.", (result, task.error)
    (grade,) = [s.body for s in store.steps.load(task_id) if isinstance(s.body, GradeStep)]
    assert grade.error is not None and grade.error["code"] == "grade_skipped", grade
    assert "tenant/no-judge" in grade.error["message"] and grade.usage.total == 0
    assert store.budgets.get(task.budget_id).used == _answer_tokens(store, task_id)
