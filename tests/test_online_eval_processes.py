"""Online evaluation under real SIGKILL: a worker process (``agentq run-task``) grading a task
its alias sampled is killed at every point between the answer and the grade step's commit
(the grade begun, recorded, counted in its version's bucket, its step item written), another
process resumes, and the grade is counted exactly once in the bucket of the version the task
ran, the grader ran at most once, and the task ends ``succeeded`` with its answer."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from agentq.control.submit import submit_once
from agentq.core.agents import AgentSpec
from agentq.core.aliases import AliasSpec
from agentq.core.models import GradeStep, Script, TaskStatus
from agentq.core.quality import hour_of
from agentq.runtime import Settings, build_registry, build_store
from agentq.worker import run_task

from tests.conftest import child_env
from tests.helpers import run_agentq

TASK_ID = "sampled-task"


def _runs(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


@pytest.mark.parametrize(
    ("crash_at", "scored"),
    [
        ("after_grade_begin", False),  # begun, never recorded: not run again, counted once as an error
        ("after_grade", True),  # recorded, not counted
        ("after_online_count", True),  # counted, not committed: the resume's count is a no-op
        ("after_step_put:2", True),  # the grade step's item written, META not yet
    ],
)
def test_a_worker_killed_during_a_sampled_grade_counts_it_once_in_its_versions_bucket(
    crash_at: str, scored: bool, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(settings)
    for answer in ("first version", "DONE"):
        spec = AgentSpec(
            name="support", provider="scripted", script=Script.model_validate({"turns": [{"text": answer}]}), system="s"
        )
        store.agents.create("t", spec)
    alias = {"versions": [{"version": 2, "weight": 100}], "online": {"rate": 1, "grade": {"grader": "says_done"}}}
    store.aliases.set("t", "support", "prod", AliasSpec.model_validate(alias))
    submit_once(store, build_registry(settings), {"goal": "g", "agent": "support@prod"}, tenant="t", task_id=TASK_ID)
    ledger = tmp_path / "ledger.jsonl"
    crashed = run_agentq(
        ["run-task", TASK_ID, "--lease", "1"],
        env=child_env(settings, AGENTQ_CRASH_AT=crash_at, AGENTQ_TEST_LEDGER=str(ledger)),
        timeout=120,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    resumed = run_task(TASK_ID, settings=settings, lease_seconds=1, wait_seconds=20)
    assert resumed.status is TaskStatus.SUCCEEDED, resumed
    task = store.tasks.get(TASK_ID)
    assert task.result == "DONE" and task.submission.agent == "support@2"
    steps = store.steps.load(TASK_ID)
    assert [s.body.kind for s in steps] == ["llm", "grade"]
    (grade,) = [s.body for s in steps if isinstance(s.body, GradeStep)]
    assert len(_runs(ledger)) == (1 if scored else 0)  # at most once: begun and lost, it is not run again
    now = hour_of(time.time())
    (bucket,) = store.quality.read("t", "support", now - 1, now + 1)
    assert (bucket.version, bucket.graded) == (2, 1)
    if scored:
        assert grade.passed and (bucket.passed, bucket.errors) == (1, 0)
    else:
        assert grade.error is not None and grade.error["code"] == "grader_interrupted"
        assert (bucket.passed, bucket.errors) == (0, 1)
