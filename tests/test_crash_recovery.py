"""Invariants 1 and 3 under real SIGKILL: a worker process is killed at every step boundary
(between every pair of writes), another process resumes, and the outcome matches an
uninterrupted run; no side-effecting tool runs twice.

The killed worker is ``agentq run-task`` in a process of its own. The one that resumes is this
test's process, through the same ``run_task`` (claim as soon as the dead one's 1 s lease
lapses): it only has to be another process, and a process start per scenario is what made this
module slow. ``run-task`` as a command that resumes is covered by tests/test_zombie_worker.py."""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from agentq.core import faults
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import LLMStep, StepRecord, TaskStatus, ToolsStep
from agentq.runtime import Settings, build_registry, build_store
from agentq.storage.container import Storage, memory_storage
from agentq.worker import run_task

from tests.conftest import child_env
from tests.helpers import call, run_agentq, scripted

TASK_ID = "crash-task"
TURNS: list[dict[str, Any]] = [
    {
        "text": "first look",
        "tool_calls": [call("lookup", query="a"), call("charge_card", amount_cents=100, memo="one")],
    },
    {"text": "second", "tool_calls": [call("charge_card", amount_cents=200, memo="two"), call("lookup", query="b")]},
    {"text": "final answer"},
]
TOOLS = ["lookup", "charge_card"]

# How often each point is passed in an uninterrupted run of TURNS: kill at every pass.
PASSES = {
    "after_claim": 1,
    "after_reserve": 3,
    "after_llm_call": 3,
    "after_step_put": 5,  # every commit: 3 LLM steps, 2 tools steps (a step item written, META not yet)
    "after_llm_commit": 3,
    "after_effect_begin": 2,
    "after_tool_run": 4,
    "after_effect_finish": 2,
    "after_tools_commit": 2,
}
SCENARIOS = [f"{point}:{n}" for point, count in PASSES.items() for n in range(1, count + 1)]
# tool runs in order: lookup, charge_card, charge_card, lookup -> passes 2 and 3 of
# after_tool_run are charge_card between "started" and "done": outcome unknown by design.
UNKNOWN_OUTCOME = {"after_effect_begin:1", "after_effect_begin:2", "after_tool_run:2", "after_tool_run:3"}


def _points_named_in_the_package() -> set[str]:
    """Every point the package passes: ``crash_point("...")`` (each literal of its argument, a
    conditional's too) and the ``after_create`` of an engine operation (``_operation.py``)."""
    named: set[str] = set()
    for path in (Path(faults.__file__).parent.parent).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "crash_point" and node.args:
                named |= {
                    c.value for c in ast.walk(node.args[0]) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
            elif isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value.value
                if any(getattr(t, "id", None) == "after_create" for t in targets) and isinstance(value, str):
                    named.add(value)
    return named


def test_every_point_a_worker_passes_is_one_a_test_may_stop_it_at() -> None:
    # tests/stopped_worker.stopped_at refuses a point not in CRASH_POINTS: one left out there
    # (after_message_commit was) could never be stopped at in-process.
    named = _points_named_in_the_package()
    assert {"after_message_commit", "after_spawn", "after_llm_commit"} <= named  # the scan sees each form
    assert named - set(faults.CRASH_POINTS) == set()


def _crashing_worker(settings: Settings, crash_at: str, ledger: Path) -> subprocess.CompletedProcess[str]:
    return run_agentq(
        ["run-task", TASK_ID, "--lease", "1"],
        # A 1 s maximum call: the killed worker's hold (its call may be in flight for all the
        # resumer knows) stays counted about 3 s, not the suite's 30.
        env=child_env(settings, AGENTQ_CRASH_AT=crash_at, AGENTQ_TEST_LEDGER=str(ledger), AGENTQ_MAX_CALL_SECONDS="1"),
        timeout=120,
    )


def _shape(steps: list[StepRecord]) -> list[Any]:
    """What the conversation said, without timings: comparable across runs."""
    out: list[Any] = []
    for record in steps:
        body = record.body
        if isinstance(body, LLMStep):
            out.append(("llm", body.content, body.stop_reason, body.usage.model_dump()))
        else:
            assert isinstance(body, ToolsStep)
            out.append(("tools", [(r.tool_use_id, r.name, r.content, r.is_error) for r in body.results]))
    return out


@pytest.fixture
def expected(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The uninterrupted run: the same task id (tool_use ids derive from it), with a ledger of
    its own, on the in-memory twin (its shape has no timings and no storage in it; milliseconds,
    so each scenario makes its own and the scenarios are not tied to one xdist worker)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AGENTQ_TEST_LEDGER", str(tmp_path_factory.mktemp("baseline") / "ledger.jsonl"))
        store = memory_storage()
        store.tasks.create(scripted(TURNS, tools=TOOLS), tenant="t", task_id=TASK_ID)
        tools = build_registry(Settings(table="memory", bucket="memory", tool_modules=("tests.effect_tools",)))
        result = Engine(store, worker_id="baseline", tools=tools, config=EngineConfig(lease_seconds=5)).run(TASK_ID)
    assert result.status is TaskStatus.SUCCEEDED
    return _shape(store.steps.load(TASK_ID))


@pytest.mark.parametrize("crash_at", SCENARIOS)
def test_killed_worker_resumes_to_the_same_conversation_without_repeating_effects(
    crash_at: str, settings: Settings, tmp_path: Path, expected: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store: Storage = build_store(settings)
    store.tasks.create(scripted(TURNS, tools=TOOLS), tenant="t", task_id=TASK_ID)
    ledger = tmp_path / "ledger.jsonl"

    crashed = _crashing_worker(settings, crash_at, ledger)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    before = store.steps.load(TASK_ID)
    held_at_kill = store.tasks.get(TASK_ID).inflight  # the killed worker's hold, if it held one

    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    resumed = run_task(TASK_ID, settings=settings, lease_seconds=1, wait_seconds=20)
    assert resumed.status is TaskStatus.SUCCEEDED, resumed
    if resumed.outcome == "not_claimed":  # killed after its final commit: nothing left to do
        assert crash_at == "after_llm_commit:3"
    else:
        assert resumed.outcome == "finished" and resumed.resumed_from_step == len(before)

    after = store.steps.load(TASK_ID)
    # Resume, not restart: every step committed before the kill survives unchanged.
    assert after[: len(before)] == before
    assert all(s.epoch == 1 for s in before) and all(s.epoch == 2 for s in after[len(before) :])
    assert len(after) == len(expected)

    # At most once: every charge happened no more than once per idempotency key.
    charges = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
    keys = [c["key"] for c in charges]
    assert len(keys) == len(set(keys))

    shape = _shape(after)
    if crash_at in UNKNOWN_OUTCOME:
        unknown = [
            r for s in after if isinstance(s.body, ToolsStep) for r in s.body.results if r.status == "unknown_outcome"
        ]
        assert len(unknown) == 1 and unknown[0].name == "charge_card"
        # Killed before the charge ran: it never happens; killed after: it happened once.
        # Either way the resumed worker did not run it again.
        assert len(charges) == (1 if crash_at.startswith("after_effect_begin") else 2)
        assert [kind for kind, *_ in shape] == [kind for kind, *_ in expected]
    else:
        assert shape == expected
        assert len(charges) == 2

    # The killed worker's hold, if it held one, stays counted until its call could no longer
    # complete (set aside as lapsed, invariant 4); then it is counted as spent, once: whether the
    # provider answered the killed worker is unknown. (A resume that claims after the deadline,
    # on a loaded machine, counts it as spent at once: then nothing is left lapsed here.)
    task = store.tasks.get(TASK_ID)
    lapsed = task.lapsed_holds
    assert store.budgets.get(TASK_ID).reserved == sum(h.amount for h in lapsed.values())
    if lapsed:
        time.sleep(max(0.0, max(h.until or 0.0 for h in lapsed.values()) - time.time()) + 0.05)
        engine = Engine(store, worker_id="releaser", tools=build_registry(settings))
        assert engine.spend_lapsed_holds(task) == 0
        assert engine.spend_lapsed_holds(task) == 0  # a second pass spends nothing more
    budget = store.budgets.get(TASK_ID)
    llm_usage = sum(s.body.usage.total for s in after if isinstance(s.body, LLMStep))
    assert budget.reserved == 0 and store.tasks.get(TASK_ID).lapsed_holds == {}
    # The committed calls' reported usage, plus the killed worker's hold (outcome unknown).
    assert budget.used == llm_usage + (held_at_kill.amount if held_at_kill else 0)
    assert set(lapsed) <= ({held_at_kill.epoch} if held_at_kill else set())
