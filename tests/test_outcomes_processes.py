"""Outcomes under real SIGKILL (ARCHITECTURE 3, the grade): a worker process (``agentq
run-task``) is killed at every point between the answer and the grade's commit, another process
resumes, and the grader ran at most once an answer (its ledger), the grading model's tokens are
counted once, and the task ends as an uninterrupted run does: retried with feedback, then
succeeded; or failed_outcome. Killed after the grade was begun and before it was recorded, the
grader is not run again: the grade fails ``grader_interrupted`` and the answer is kept."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from agentq.core.models import GradeStep, LLMStep, TaskStatus, TaskSubmission
from agentq.runtime import Settings, build_store
from agentq.worker import run_task

from tests.conftest import child_env
from tests.helpers import run_agentq

TASK_ID = "graded-task"
RUBRIC_SCRIPT = {"turns": [{"text": '{"score": 1, "feedback": ""}'}]}


def _submission(turns: list[str], **outcome: Any) -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "goal": "finish the job",
            "provider": "scripted",
            "script": {"turns": [{"text": t} for t in turns]},
            "outcome": {"grader": "says_done", "max_attempts": 3, **outcome},
        }
    )


def _kill_then_resume(
    settings: Settings, crash_at: str, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any]:
    crashed = run_agentq(
        ["run-task", TASK_ID, "--lease", "1"],
        env=child_env(settings, AGENTQ_CRASH_AT=crash_at, AGENTQ_TEST_LEDGER=str(ledger), AGENTQ_MAX_CALL_SECONDS="1"),
        timeout=120,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    return crashed, run_task(TASK_ID, settings=settings, lease_seconds=1, wait_seconds=20)


def _runs(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


# An uninterrupted run: answer 1 ("not yet") graded below the bar, answer 2 ("DONE") passes.
# Each point is passed twice (once an answer): kill at each pass.
RESUMES_AND_GRADES_ONCE = [
    f"{point}:{n}" for point in ("after_llm_commit", "after_grade", "after_grade_commit") for n in (1, 2)
] + ["after_step_put:2", "after_step_put:4"]  # the grade steps' items written, META not yet


@pytest.mark.parametrize("crash_at", RESUMES_AND_GRADES_ONCE)
def test_a_worker_killed_between_the_answer_and_the_grades_commit_resumes_and_grades_once(
    crash_at: str, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(settings)
    store.tasks.create(_submission(["not yet", "DONE", "never"], rubric="Says DONE.", script=RUBRIC_SCRIPT),
                       tenant="t", task_id=TASK_ID)  # fmt: skip
    ledger = tmp_path / "ledger.jsonl"
    _, resumed = _kill_then_resume(settings, crash_at, ledger, monkeypatch)
    assert resumed.status is TaskStatus.SUCCEEDED, resumed
    task = store.tasks.get(TASK_ID)
    assert task.result == "DONE"
    steps = store.steps.load(TASK_ID)
    assert [s.body.kind for s in steps] == ["llm", "grade", "llm", "grade"]
    graded = [s.body for s in steps if isinstance(s.body, GradeStep)]
    assert [(g.attempt, g.passed) for g in graded] == [(1, False), (2, True)]
    # The grader ran once an answer, whoever committed its grade.
    assert sorted(r["attempt"] for r in _runs(ledger)) == [1, 2]
    replayed = [g.attempt for g in graded if g.replayed]
    recorded_not_committed = {
        "after_grade:1": [1],
        "after_grade:2": [2],
        "after_step_put:2": [1],
        "after_step_put:4": [2],
    }
    assert replayed == recorded_not_committed.get(crash_at, [])
    # The grading model's tokens (the rubric, asked once the code check passed: answer 2)
    # counted once in the task and its budget, beside the agent's.
    agent = sum(s.body.usage.total for s in steps if isinstance(s.body, LLMStep))
    grading = sum(g.usage.total for g in graded)
    assert grading > 0 and task.grade is not None
    assert task.grade["tokens_in"] + task.grade["tokens_out"] == grading
    assert task.tokens_in + task.tokens_out == agent + grading
    budget = store.budgets.get(TASK_ID)
    assert budget.used == agent + grading and budget.reserved == 0 and budget.unknown == 0  # the holds settled


@pytest.mark.parametrize("attempt", [1, 2])
def test_a_worker_killed_after_beginning_a_grade_never_runs_the_grader_again_and_keeps_the_answer(
    attempt: int, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(settings)
    store.tasks.create(_submission(["not yet", "still not", "never"]), tenant="t", task_id=TASK_ID)
    ledger = tmp_path / "ledger.jsonl"
    _, resumed = _kill_then_resume(settings, f"after_grade_begin:{attempt}", ledger, monkeypatch)
    assert resumed.status is TaskStatus.FAILED_OUTCOME, resumed
    task = store.tasks.get(TASK_ID)
    assert task.error is not None and task.error["code"] == "grader_interrupted"
    assert task.result == ["not yet", "still not"][attempt - 1]  # the answer is kept
    assert [r["attempt"] for r in _runs(ledger)] == list(range(1, attempt))  # the begun one never ran


def test_retries_with_feedback_end_failed_outcome_across_a_kill(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(settings)
    store.tasks.create(_submission(["a", "b", "c", "never"]), tenant="t", task_id=TASK_ID)
    ledger = tmp_path / "ledger.jsonl"
    _, resumed = _kill_then_resume(settings, "after_grade:2", ledger, monkeypatch)
    assert resumed.status is TaskStatus.FAILED_OUTCOME
    task = store.tasks.get(TASK_ID)
    assert task.result == "c" and task.error is not None and task.error["code"] == "outcome_failed"
    assert task.error["feedback"] == "The answer must say DONE."
    assert sorted(r["attempt"] for r in _runs(ledger)) == [1, 2, 3]


@pytest.mark.parametrize("attempt", [1, 2])
def test_a_worker_killed_mid_grade_leaves_the_grading_calls_hold_counted_never_dropped(
    attempt: int, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(settings)
    rubric = {"rubric": "Says DONE.", "script": {"turns": [{"text": '{"score": 0.5, "feedback": "again"}'}] * 3}}
    store.tasks.create(_submission(["DONE 1", "DONE 2", "never"], **rubric), tenant="t", task_id=TASK_ID)
    ledger = tmp_path / "ledger.jsonl"
    crashed = run_agentq(
        ["run-task", TASK_ID, "--lease", "1"],
        env=child_env(settings, AGENTQ_CRASH_AT=f"after_grade_begin:{attempt}", AGENTQ_TEST_LEDGER=str(ledger),
                      AGENTQ_MAX_CALL_SECONDS="1"),
        timeout=120,
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    held = store.tasks.get(TASK_ID).inflight  # the grading call's hold, taken before the grade began
    assert held is not None and held.step == 2 * attempt
    before = store.budgets.get(TASK_ID)
    assert before.reserved == held.amount
    resumed = run_task(TASK_ID, settings=settings, lease_seconds=1, wait_seconds=20)
    assert resumed.status is TaskStatus.FAILED_OUTCOME, resumed
    task = store.tasks.get(TASK_ID)
    assert task.error is not None and task.error["code"] == "grader_interrupted"
    assert task.result == f"DONE {attempt}"  # the answer is kept
    budget = store.budgets.get(TASK_ID)
    # Its outcome unknown to the resumed worker: still held (set aside) or counted as spent.
    assert budget.reserved + budget.unknown == held.amount, budget
    assert budget.used <= budget.cap
    steps = store.steps.load(TASK_ID)
    agent = sum(s.body.usage.total for s in steps if isinstance(s.body, LLMStep))
    graded = sum(s.body.usage.total for s in steps if isinstance(s.body, GradeStep))
    assert budget.known == agent + graded
