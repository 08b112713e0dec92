"""The grading model's call holds the task tree's budget like any model call (ARCHITECTURE 4,
``used <= cap``): its input estimate plus its output allowance are held before it is sent, and
the grade's commit settles the hold to what it used. A budget that cannot cover the hold ends
the task ``cost_exceeded`` before the grading model is asked, the answer kept, and a raise
of the cap resumes it at the grade (tests/test_outcomes_processes.py kills workers mid-grade).
It holds every window the agent's own calls hold, too (spend <= cap at every scope): the
tenant's hour and the caps of the task's end user, agent and API key, which defer it, pause it
at a soft threshold, and count what it used."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, cast

import pytest

from agentq.control.operations import raise_budget
from agentq.control.submit import parse_submission
from agentq.core.caps import CapLimits
from agentq.core.engine import Engine, EngineConfig, RunResult
from agentq.core.models import GradeStep, LLMStep, TaskStatus, TaskSubmission
from agentq.core.tenancy import TenantLimits
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq.storage.tenant_windows import TenantWindows

from tests.fake_messages_api import FakeMessagesAPI, FakeReply, message_reply, point_anthropic_at, usage_dict

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


def _create_in_scope(store: Storage, scope: str, name: str) -> str:
    """A task with room to spare in its budget, spending against ``scope`` ``name``."""
    body = _body(1_000_000)
    if scope in ("user", "agent"):
        body[scope] = name
    return store.tasks.create(parse_submission(body), tenant="t", key_id=name if scope == "key" else None).task_id


def _again(store: Storage, registry: ToolRegistry, task_id: str) -> RunResult:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=10)).run(task_id)


def _measured_with_hold(store: Storage, registry: ToolRegistry) -> tuple[int, int, int, int]:
    """(the agent's hold, the agent's usage, the grading call's usage, the grading call's hold)
    of a run with room to spare."""
    task_id = _run(store, registry, 1_000_000)
    steps = [s.body for s in store.steps.load(task_id)]
    (answer,) = [s for s in steps if isinstance(s, LLMStep)]
    (grade,) = [s for s in steps if isinstance(s, GradeStep)]
    assert store.tasks.get(task_id).status is TaskStatus.SUCCEEDED
    return answer.reserved_tokens, answer.usage.total, grade.usage.total, grade.reserved_tokens


def _measured(store: Storage, registry: ToolRegistry) -> tuple[int, int, int]:
    """(the agent's hold, the agent's usage, the grading call's usage) of a run with room to spare."""
    return _measured_with_hold(store, registry)[:3]


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.75, 0.99])
def test_a_cap_with_room_for_the_answer_but_not_the_grading_call_is_never_passed_and_keeps_the_answer(
    store: Storage, registry: ToolRegistry, fraction: float
) -> None:
    agent_hold, agent, grading, grading_hold = _measured_with_hold(store, registry)
    assert agent_hold < agent + grading  # the grading call alone would take the tree past such caps
    cap = agent_hold + int(fraction * (agent + grading - agent_hold))
    task_id = _run(store, registry, cap)
    task = store.tasks.get(task_id)
    budget = store.budgets.get(task.budget_id)
    assert budget.used <= budget.cap == cap, budget
    assert budget.reserved == 0 and budget.unknown == 0, budget
    assert task.status is TaskStatus.COST_EXCEEDED, task
    assert task.error is not None and task.error["code"] == "budget_exceeded", task.error
    # By how much: the grading call's hold (never shrunk), against what the answer left.
    assert (task.error["needed_tokens"], task.error["available_tokens"]) == (grading_hold, budget.available)
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


@pytest.mark.parametrize("scope", ["user", "agent", "key"])
def test_every_scope_cap_of_the_task_counts_the_grading_calls_spend_and_its_windows_equal_the_trees_usage(
    store: Storage, registry: ToolRegistry, scope: str
) -> None:
    _, agent, grading = _measured(store, registry)
    store.caps.put("t", scope, "alice", CapLimits(daily_tokens=10**9, hourly_usd=Decimal(1000)))  # type: ignore[arg-type]
    task_id = _create_in_scope(store, scope, "alice")
    assert _again(store, registry, task_id).status is TaskStatus.SUCCEEDED
    assert [s.body.kind for s in store.steps.load(task_id)] == ["llm", "grade"]
    budget = store.budgets.get(task_id)
    assert budget.used == agent + grading and budget.used_micros > 0, budget
    usage = store.caps.usage("t", scope, "alice")  # type: ignore[arg-type]
    for window in ("hour", "day"):  # held for the grading call too, and settled to what it used
        assert usage[f"{window}_tokens"] == usage[f"{window}_used_tokens"] == budget.used
        assert usage[f"{window}_usd"] == usage[f"{window}_used_usd"] == budget.used_micros


def test_a_cap_with_room_for_the_answer_but_not_the_grading_call_defers_the_task_holding_nothing_until_raised(
    store: Storage, registry: ToolRegistry
) -> None:
    agent_hold, agent, grading = _measured(store, registry)
    store.caps.put("t", "user", "alice", CapLimits(daily_tokens=agent_hold + grading // 2))
    task_id = _create_in_scope(store, "user", "alice")
    result = _again(store, registry, task_id)
    assert result.outcome == "deferred" and result.error is not None, result
    assert (result.error["code"], result.error["scope"], result.error["window"]) == ("cap_reached", "user", "day")
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.RUNNING and task.lease_expires == 0 and task.inflight is None  # holds nothing
    assert [s.body.kind for s in store.steps.load(task_id)] == ["llm"]  # the grading model was never asked
    assert store.effects.get(task_id, "grade-2") is None  # nor the grade begun
    usage = store.caps.usage("t", "user", "alice")
    assert usage["day_tokens"] == usage["day_used_tokens"] == agent  # the answer only; the grade's hold given back
    budget = store.budgets.get(task_id)
    assert budget.used == agent and budget.reserved == 0, budget

    store.caps.put("t", "user", "alice", CapLimits(daily_tokens=agent + grading + 10_000))  # a raise: it grades
    assert _again(store, registry, task_id).status is TaskStatus.SUCCEEDED
    assert [s.body.kind for s in store.steps.load(task_id)] == ["llm", "grade"]
    usage = store.caps.usage("t", "user", "alice")
    assert usage["day_tokens"] == usage["day_used_tokens"] == agent + grading == store.budgets.get(task_id).used


@pytest.mark.parametrize("approved", [True, False])
def test_a_soft_threshold_the_grading_call_would_pass_pauses_for_approval_as_the_agents_own_calls_do(
    store: Storage, registry: ToolRegistry, approved: bool
) -> None:
    agent_hold, agent, grading = _measured(store, registry)
    store.caps.put("t", "agent", "helper", CapLimits(daily_tokens=10**9, soft_daily_tokens=agent_hold + grading // 2))
    task_id = _create_in_scope(store, "agent", "helper")
    assert _again(store, registry, task_id).status is TaskStatus.PAUSED
    asked = store.approvals.pending(task_id)
    assert asked is not None and asked.use_id.startswith("agentq-cap-agent-day-") and "soft threshold" in asked.question
    assert store.tasks.get(task_id).inflight is None  # it waits holding nothing
    assert store.budgets.get(task_id).reserved == 0
    assert store.caps.usage("t", "agent", "helper")["day_tokens"] == agent
    assert [s.body.kind for s in store.steps.load(task_id)] == ["llm"]

    store.approvals.decide(task_id, asked.use_id, approved=approved, note="", by="reviewer")
    result = _again(store, registry, task_id)
    task = store.tasks.get(task_id)
    usage = store.caps.usage("t", "agent", "helper")
    assert task.result == "Blue."  # the answer is kept either way
    if approved:
        assert result.status is TaskStatus.SUCCEEDED, result
        assert [s.body.kind for s in store.steps.load(task_id)] == ["llm", "grade"]
        assert usage["day_tokens"] == usage["day_used_tokens"] == agent + grading
    else:
        assert result.status is TaskStatus.COST_EXCEEDED, result
        assert task.error is not None, task
        assert "agent 'helper'" in task.error["message"] and "declined" in task.error["message"]
        assert [s.body.kind for s in store.steps.load(task_id)] == ["llm"]
        assert usage["day_tokens"] == usage["day_used_tokens"] == agent
    assert store.budgets.get(task_id).reserved == 0


@pytest.mark.parametrize("line", ["cap", "soft"])
def test_an_online_grade_a_users_cap_cannot_cover_is_skipped_and_the_task_still_succeeds(
    store: Storage, registry: ToolRegistry, line: str
) -> None:
    """A sampled task's grade only observes: a cap (or a soft threshold) in its way skips it, as a
    budget too small does, and neither defers nor pauses the task."""
    agent_hold, agent, grading = _measured(store, registry)
    room = agent_hold + grading // 2
    limits = CapLimits(daily_tokens=room) if line == "cap" else CapLimits(daily_tokens=10**9, soft_daily_tokens=room)
    store.caps.put("t", "user", "alice", limits)
    body = _body(1_000_000)
    body.update(user="alice", online={"alias": "prod", "grade": body.pop("outcome")})
    task_id = store.tasks.create(TaskSubmission.model_validate(body), tenant="t").task_id
    result = _again(store, registry, task_id)
    task = store.tasks.get(task_id)
    assert result.status is TaskStatus.SUCCEEDED and task.result == "Blue.", (result, task.error)
    (grade,) = [s.body for s in store.steps.load(task_id) if isinstance(s.body, GradeStep)]
    assert grade.error is not None and grade.error["code"] == "grade_skipped" and grade.usage.total == 0
    assert store.approvals.pending(task_id) is None
    usage = store.caps.usage("t", "user", "alice")
    assert usage["day_tokens"] == usage["day_used_tokens"] == agent == store.budgets.get(task_id).used


def test_a_grading_call_abandoned_at_its_timeout_stays_counted_on_the_users_day_as_on_the_budget(
    store: Storage, registry: ToolRegistry
) -> None:
    store.caps.put("t", "user", "alice", CapLimits(daily_tokens=10**9))
    body = _body(1_000_000)
    body["user"] = "alice"
    body["outcome"].update(timeout_seconds=1, script={"turns": [{"text": '{"score": 1}', "latency_seconds": 3}]})
    task_id = store.tasks.create(parse_submission(body), tenant="t").task_id
    assert _again(store, registry, task_id).status is TaskStatus.FAILED_OUTCOME
    (grade,) = [s.body for s in store.steps.load(task_id) if isinstance(s.body, GradeStep)]
    budget = store.budgets.get(task_id)
    assert budget.unknown == grade.reserved_tokens > 0 and budget.reserved == 0, budget
    usage = store.caps.usage("t", "user", "alice")
    # It may have been billed: the window keeps its hold, never returned on a guess, as the budget does.
    assert usage["day_tokens"] == usage["day_used_tokens"] == budget.used


@pytest.mark.parametrize("where", ["begin", "commit"])
def test_a_lease_lost_between_the_grading_calls_hold_and_its_commit_leaves_no_phantom_on_the_users_caps(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The lease is lost (a stop, a takeover) at the grade's begin, before anything is sent, or at
    its commit, after the grading model answered: the user's windows hold nothing this run did not
    spend (given back, or settled to the call's usage), so the cap never refuses calls that were
    never made."""
    from agentq.core.errors import LeaseLost

    store.caps.put("t", "user", "alice", CapLimits(daily_tokens=10**9))
    body = _body(1_000_000)
    body["user"] = "alice"
    task_id = store.tasks.create(parse_submission(body), tenant="t").task_id
    if where == "begin":
        begin = store.effects.begin

        def lost_at_grade(lease: Any, tool_use_id: str, name: str) -> Any:
            if tool_use_id.startswith("grade-"):
                raise LeaseLost("lost at the grade's begin")
            return begin(lease, tool_use_id, name)

        monkeypatch.setattr(store.effects, "begin", lost_at_grade)
    else:
        commit = store.steps.commit

        def lost_at_commit(*args: Any, **kwargs: Any) -> Any:
            if isinstance(args[2] if len(args) > 2 else kwargs.get("body"), GradeStep):
                raise LeaseLost("lost at the grade's commit")
            return commit(*args, **kwargs)

        monkeypatch.setattr(store.steps, "commit", lost_at_commit)
    _again(store, registry, task_id)  # the run ends at the lost lease, whatever it returns
    (answer,) = [s.body for s in store.steps.load(task_id) if isinstance(s.body, LLMStep)]
    graded = store.effects.get(task_id, f"grade-{_steps_committed(store, task_id) + 1}")
    usage = store.caps.usage("t", "user", "alice")
    recorded = graded is not None and graded.content is not None
    grading = GradeStep.model_validate_json(graded.content).usage.total if recorded else 0  # type: ignore[union-attr,arg-type]
    assert (where == "commit") == (grading > 0)  # the grading model answered only when lost at the commit
    assert usage["day_tokens"] == usage["day_used_tokens"] == answer.usage.total + grading, usage


def _steps_committed(store: Storage, task_id: str) -> int:
    return len(store.steps.load(task_id))


def test_a_grading_call_abandoned_at_its_timeout_by_a_worker_killed_before_the_commit_stays_unknown(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the worker is killed once the grade is recorded, before its commit: the
    successor replays the recorded grade, and the grading call's hold stays counted as spent
    (unknown). The replay used to settle it to the recorded usage (none) and give it back,
    though the call, sent and abandoned, may have been billed."""
    from tests.stopped_worker import resume, stopped_at

    body = _body(1_000_000)
    body["outcome"].update(timeout_seconds=1, script={"turns": [{"text": '{"score": 1}', "latency_seconds": 3}]})
    task = store.tasks.create(parse_submission(body), tenant="t")
    killed = Engine(store, worker_id="killed", tools=registry, config=EngineConfig(lease_seconds=1))
    with stopped_at(killed, task.task_id, "after_grade:1", monkeypatch):
        successor = Engine(store, worker_id="successor", tools=registry, config=EngineConfig(lease_seconds=1))
        resumed = resume(successor, task.task_id, wait_seconds=30)
        assert resumed.status is TaskStatus.FAILED_OUTCOME, resumed
    (grade,) = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, GradeStep)]
    assert grade.replayed and grade.reserved_tokens > 0 and grade.usage.total == 0
    budget = store.budgets.get(task.budget_id)
    assert budget.unknown == grade.reserved_tokens and budget.reserved == 0, budget
    assert budget.used <= budget.cap


@pytest.fixture
def grading_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMessagesAPI]:
    """A local Messages API for the grading model (``_graded_by_claude``): two attempts a call, at once."""
    with FakeMessagesAPI() as api:
        point_anthropic_at(api, monkeypatch.setenv)
        monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", '{"max_attempts": 2, "base_delay": 0, "max_delay": 0}')
        yield api


def _graded_by_claude() -> dict[str, Any]:
    """``_body``'s task, graded by Claude through the Anthropic API (``grading_api``)."""
    body = _body(1_000_000)
    body["outcome"].update(provider="anthropic", model="claude-sonnet-4-6", script=None)
    return body


def _grade_reply() -> FakeReply:
    return message_reply([{"type": "text", "text": '{"score": 1, "feedback": ""}'}],
                         usage=usage_dict(input_tokens=900, output_tokens=12))  # fmt: skip


@pytest.mark.parametrize("answered", [True, False], ids=["cut_then_answered", "cut_twice"])
def test_a_grading_attempt_that_may_have_been_billed_stays_counted_and_its_retry_holds_anew(
    grading_api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, answered: bool
) -> None:
    """The grading model's reply is cut after its headers, and the call is tried again: the cut
    attempt may have been billed, so its hold stays counted as unknown, on the budget and on the
    tenant's hour, and the retry is made under a hold of its own, as an agent's call's is
    (``ModelCall.rehold``). The grading call's retries used to go unseen: the hold was settled
    to the last attempt's usage, and a cut attempt's bill was dropped."""
    windows = TenantWindows(store.table)
    windows.set_limits("t", TenantLimits(hourly_tokens=1_000_000))
    cut = dataclasses.replace(_grade_reply(), cut_at=0.5)
    grading_api.enqueue(cut, _grade_reply() if answered else cut)
    task_id = store.tasks.create(parse_submission(_graded_by_claude()), tenant="t").task_id
    Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30)).run(task_id)
    asked = len(grading_api.requests)
    task = store.tasks.get(task_id)
    (step,) = [s.body for s in store.steps.load(task_id) if isinstance(s.body, GradeStep)]
    assert asked == 2 and step.reserved_tokens > 0, (asked, step)
    budget = store.budgets.get(task.budget_id)
    agent = budget.known - step.usage.total
    if answered:
        assert task.status is TaskStatus.SUCCEEDED and step.usage.total == 912, (task.status, task.error)
        assert budget.unknown == step.reserved_tokens, budget  # the cut attempt's
    else:
        assert task.status is TaskStatus.FAILED_OUTCOME and step.usage.total == 0, (task.status, task.error)
        assert budget.unknown == 2 * step.reserved_tokens, budget  # both attempts'
    assert agent > 0 and budget.reserved == 0 and task.inflight is None, budget
    assert budget.used == budget.known + budget.unknown <= budget.cap
    assert windows.usage("t") == {"held": budget.used, "used": budget.used}


def test_a_lease_lost_as_the_grading_calls_retry_holds_gives_that_hold_back_and_sends_no_retry(
    grading_api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grading model's reply is cut; the retry's hold is taken, and the run then learns its
    lease is gone (moving the hold's deadline, fenced, fails): no attempt follows, so that hold
    goes back, known unsent, and only the cut attempt's stays counted as unknown. It used to be
    counted as spent too, the grade's error naming a ``LeaseLost`` the grading thread raised."""
    import threading

    from agentq.core.engine._holds import BudgetHolds
    from agentq.core.errors import LeaseLost

    cover = BudgetHolds.cover

    def lost_on_the_grading_thread(self: BudgetHolds, s: Any, start: float) -> None:
        if threading.current_thread().name.startswith("grade-"):  # core.grading.within's thread
            raise LeaseLost("a successor claimed the task")
        cover(self, s, start)

    windows = TenantWindows(store.table)
    windows.set_limits("t", TenantLimits(hourly_tokens=1_000_000))
    body = _graded_by_claude()
    grading_api.enqueue(_grade_reply())  # a probe, graded at once: the size of the grading call's hold
    probe = store.tasks.create(parse_submission(body), tenant="probe").task_id
    Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30)).run(probe)
    (measured,) = [s.body for s in store.steps.load(probe) if isinstance(s.body, GradeStep)]
    monkeypatch.setattr(BudgetHolds, "cover", lost_on_the_grading_thread)
    grading_api.enqueue(dataclasses.replace(_grade_reply(), cut_at=0.5), _grade_reply())
    task_id = store.tasks.create(parse_submission(body), tenant="t").task_id
    Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30)).run(task_id)
    asked = len(grading_api.requests)
    task = store.tasks.get(task_id)
    assert asked == 2, asked  # the probe's answer and the cut attempt: no retry after it
    assert task.status is TaskStatus.FAILED_OUTCOME, (task.status, task.error)
    budget = store.budgets.get(task.budget_id)
    assert budget.unknown == measured.reserved_tokens > 0, budget  # the cut attempt's hold alone
    assert budget.reserved == 0 and task.inflight is None, budget
    assert task.error is not None and "lease was lost" in task.error["message"], task.error
    assert windows.usage("t") == {"held": budget.used, "used": budget.used}
