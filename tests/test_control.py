"""Cancel, human approval, budget raise and fork on the local stack (worker processes,
moto's Step Functions running the fan-out ASL)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from agentq.control import operations as control
from agentq.control.submit import submit
from agentq.core.errors import IllegalTransition, TaskNotFound, ValidationError
from agentq.core.models import LLMStep, Task, TaskStatus, ToolsStep
from agentq.runtime import build_fanout, build_registry
from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests.helpers import call, scripted


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    ledger = tmp_path_factory.mktemp("ledger") / "ledger.jsonl"
    with LocalStack(prefix="ctl", workers=2, api=False, tool_modules=("tests.effect_tools",),
                    extra_env={"AGENTQ_TEST_LEDGER": str(ledger), "PYTHONPATH": os.getcwd()}) as s:  # fmt: skip
        s.ledger = ledger  # type: ignore[attr-defined]
        yield s


def _submit(stack: LocalStack, sub: Any) -> Task:
    assert stack.settings is not None
    return submit(stack.store(), build_registry(stack.settings), sub, tenant="t", queues=stack.queues())


def _until(store: Storage, task_id: str, pred: Any, timeout: float = 60) -> Task:
    deadline = time.monotonic() + timeout
    while not pred(task := store.tasks.get(task_id)):
        assert time.monotonic() < deadline, f"task {task_id} stuck in {task.status.value} at step {task.step}"
        time.sleep(0.05)
    return task


def test_cancel_mid_fan_out_stops_the_whole_subtree_and_keeps_partial_results(stack: LocalStack) -> None:
    store = stack.store()
    slow = [
        {
            "goal": f"slow {i}",
            "script": {
                "turns": [
                    {"text": f"slow {i} step {j}", "latency_seconds": 0.4, "tool_calls": [call("lookup", query="q")]}
                    for j in range(30)
                ]
            },
        }
        for i in range(4)
    ]
    root = _submit(stack, scripted([{"text": "fan out", "tool_calls": [call("spawn_subagents", subagents=slow, max_concurrency=2)]}, {"text": "never"}],
                                   tools=["spawn_subagents", "lookup"], max_tokens=400_000))  # fmt: skip
    _until(store, root.task_id, lambda t: t.status is TaskStatus.WAITING)
    children = control.subtree(store, store.tasks.get(root.task_id))[1:]
    _until(store, children[0].task_id, lambda t: t.step >= 3)

    cancelled = control.cancel(store, root.task_id, fanout=build_fanout(stack.settings))  # type: ignore[arg-type]
    assert root.task_id in cancelled and len(cancelled) == 5
    time.sleep(2.5)  # let running workers reach their next step boundary, pending children their message
    tree = control.subtree(store, store.tasks.get(root.task_id))
    assert all(t.status is TaskStatus.CANCELLED for t in tree)
    steps_then = {t.task_id: t.step for t in tree}
    time.sleep(1.5)
    assert {
        t.task_id: t.step for t in control.subtree(store, store.tasks.get(root.task_id))
    } == steps_then  # nobody writes on
    started = [t for t in tree[1:] if t.claim_count]
    never_started = [t for t in tree[1:] if not t.claim_count]
    assert len(started) == 2 and len(never_started) == 2  # max_concurrency 2: the others never ran
    assert all(t.result and t.result.startswith("slow") for t in started)  # partial results kept
    budget = store.budgets.get(root.task_id)
    every_call = sum(
        s.body.usage.total for t in tree for s in store.steps.load(t.task_id) if isinstance(s.body, LLMStep)
    )
    assert budget.used >= every_call and budget.used <= budget.cap  # in-flight calls of stopped workers count too
    with pytest.raises(IllegalTransition, match="already cancelled"):
        control.cancel(store, root.task_id)


def test_cancel_stops_the_fan_out_first_then_cancels_children_that_never_ran_before_running_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The order that keeps a freed Map slot from starting another child mid-cancel: stop the
    executions while every task is still live, then the children nobody ran, then the rest."""
    from agentq.core.records import SpawnRecord
    from agentq.storage.container import memory_storage

    store = memory_storage()
    root = store.tasks.create(scripted([{"text": "r"}]), tenant="t")
    kids = [
        # Each with a budget of its own (as a spawn funds one), so the cancel can fold it into the root's.
        store.tasks.create(scripted([{"text": "c"}]), tenant="t", parent_id=root.task_id, depth=1)
        for _ in range(3)
    ]
    for task in (root, kids[0]):  # the root and the first child have run
        assert store.tasks.claim(task.task_id, "w", 30) is not None
    spawn = SpawnRecord(spawn_id="s", children=[k.task_id for k in kids], max_concurrency=1, state="created",
                        created_at=0.0, epoch=1, execution_arn="arn:aws:states:::execution:fanout:s")  # fmt: skip
    monkeypatch.setattr(store.spawns, "list", lambda task_id: [spawn] if task_id == root.task_id else [])

    class Fanout:
        def __init__(self) -> None:
            self.live_at_stop: list[bool] = []

        def stop(self, arn: str, reason: str) -> None:
            every = [root, *kids]
            self.live_at_stop = [not store.tasks.get(t.task_id).status.terminal for t in every]

    fanout = Fanout()
    cancelled = control.cancel(store, root.task_id, fanout=fanout)
    assert fanout.live_at_stop == [True] * 4  # stopped before any task was cancelled
    assert cancelled == [kids[1].task_id, kids[2].task_id, root.task_id, kids[0].task_id]


@pytest.mark.parametrize("approved", [True, False])
def test_request_approval_pauses_without_a_worker_and_the_decision_resumes_the_task(
    stack: LocalStack, approved: bool
) -> None:
    store, queues = stack.store(), stack.queues()
    turns = [
        {
            "text": "I need a sign-off",
            "tool_calls": [
                call("request_approval", question="Wire $5,000 to ACME?"),
                call("charge_card", amount_cents=500000, memo="acme"),
            ],
        },
        {"text": "done after the decision"},
    ]
    task = _submit(stack, scripted(turns, tools=["request_approval", "charge_card"]))
    paused = _until(store, task.task_id, lambda t: t.status is TaskStatus.PAUSED)
    assert paused.lease_expires == 0 and paused.step == 1  # no worker holds it; the ask is committed
    time.sleep(1.0)
    assert store.tasks.get(task.task_id).status is TaskStatus.PAUSED
    with pytest.raises(TaskNotFound):
        control.decide(store, queues, task.task_id, approved=True, tenant="someone-else")

    control.decide(store, queues, task.task_id, approved=approved, note="checked the invoice", by="alice")
    final = _until(store, task.task_id, lambda t: t.status.terminal)
    assert final.status is TaskStatus.SUCCEEDED
    results = store.steps.load(task.task_id)[1].body.results
    verdict = "APPROVED" if approved else "REJECTED"
    assert results[0].content == f"{verdict} by alice: checked the invoice"
    assert results[1].name == "charge_card"
    if approved:
        assert results[1].content.startswith("charged 500000 cents")
    else:  # a rejected ask stops the side effects the model put in the same turn
        assert results[1].is_error and results[1].content.startswith("not run: the approval")
        assert not results[1].side_effects
    with pytest.raises(IllegalTransition):
        control.decide(store, queues, task.task_id, approved=True)


def test_a_budget_raise_resumes_a_cost_exceeded_task_from_its_checkpoint(stack: LocalStack) -> None:
    store, queues = stack.store(), stack.queues()
    turns = [{"text": f"turn {i}", "tool_calls": [call("lookup", query=str(i), size=1500)]} for i in range(6)] + [
        {"text": "finished"}
    ]
    task = _submit(stack, scripted(turns, tools=["lookup"], max_tokens=4000, max_output_tokens=200))
    stopped = _until(store, task.task_id, lambda t: t.status.terminal)
    assert stopped.status is TaskStatus.COST_EXCEEDED
    before = store.steps.load(task.task_id)
    with pytest.raises(ValidationError):
        control.raise_budget(store, queues, task.task_id, add_tokens=0)

    control.raise_budget(store, queues, task.task_id, add_tokens=100_000)
    final = _until(store, task.task_id, lambda t: t.status.terminal)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "finished" and final.error is None
    after = store.steps.load(task.task_id)
    assert after[: len(before)] == before
    budget = store.budgets.get(task.task_id)
    assert budget.cap == 104_000 and budget.used == sum(
        s.body.usage.total for s in after if isinstance(s.body, LLMStep)
    )


def test_fork_from_step_n_with_another_model_reuses_history_and_never_repeats_its_effects(stack: LocalStack) -> None:
    assert stack.settings is not None
    store, queues = stack.store(), stack.queues()
    ledger = stack.ledger  # type: ignore[attr-defined]
    turns = [
        {"text": "pay first", "tool_calls": [call("charge_card", amount_cents=700, memo="fork-test")]},
        {"text": "look", "tool_calls": [call("lookup", query="x")]},
        {"text": "original ending"},
    ]
    source = _until(
        store, _submit(stack, scripted(turns, tools=["charge_card", "lookup"])).task_id, lambda t: t.status.terminal
    )
    charges_before = ledger.read_text().count('"amount": 700}') if ledger.exists() else 0
    assert charges_before == 1

    other_script = {
        "turns": [
            {"text": "unused: history covers turn 1"},
            {"text": "a different look", "tool_calls": [call("lookup", query="y")]},
            {"text": "forked ending"},
        ]
    }
    fork = control.fork(store, build_registry(stack.settings), queues, source.task_id, at_step=2,
                        overrides={"model": "claude-haiku-4-5", "script": other_script})  # fmt: skip
    final = _until(store, fork.task_id, lambda t: t.status.terminal)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "forked ending"
    src_steps, fork_steps = store.steps.load(source.task_id), store.steps.load(fork.task_id)
    assert [s.body for s in fork_steps[:2]] == [s.body for s in src_steps[:2]]  # copied, not re-run
    assert fork_steps[2].body.model == "claude-haiku-4-5"
    assert json.dumps(fork_steps[2].body.content).count("a different look") == 1
    assert ledger.read_text().count('"amount": 700}') == 1  # the charge in step 2 did not happen again
    with pytest.raises(ValidationError, match="at_step must be between 0 and 5"):
        control.fork(store, build_registry(stack.settings), queues, source.task_id, at_step=9)
    assert isinstance(fork_steps[1].body, ToolsStep)
