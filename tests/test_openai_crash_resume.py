"""A task on provider ``openai`` survives its worker's SIGKILL like any other (invariants 1 and
3): a ``run-task`` process talking to a local Chat Completions server is killed after the model
answered but before the step was committed, or just after the commit; another process resumes
from the committed steps, sends the request the dead one would have sent, and the task ends
with the same conversation, the side effect done once and the budget charged for the calls
the steps record plus the hold of the one that was answered and lost (its outcome unknown, the
hold is counted until its deadline and then spent, never returned: ARCHITECTURE invariant 4)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission, ToolsStep
from agentq.runtime import Settings, build_store
from agentq.worker import run_task

from tests.conftest import child_env
from tests.fake_model_servers import FakeChatCompletions, FakeReply, Recorded, chat_completion
from tests.helpers import run_agentq, wait_for

TASK_ID = "openai-crash"
MODEL = "gpt-4.1-mini"


def plan(recorded: Recorded) -> FakeReply:
    """A model that charges once, then answers: what it says depends only on the conversation."""
    last = recorded.body["messages"][-1]
    if last["role"] == "tool":
        return chat_completion(f"done: {last['content'][:20]}", prompt_tokens=300, completion_tokens=8)
    return chat_completion(None, [("charge_card", {"amount_cents": 500, "memo": "order"})],
                           prompt_tokens=200, completion_tokens=20)  # fmt: skip


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeChatCompletions]:
    with FakeChatCompletions(responder=plan) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.openai_base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        yield fake


@pytest.mark.parametrize("crash_at", ["after_llm_call:1", "after_llm_commit:1"])
def test_a_killed_worker_on_openai_resumes_from_its_steps_without_repeating_the_charge(
    crash_at: str, server: FakeChatCompletions, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(settings)
    submission = TaskSubmission(goal="charge the order", provider="openai", model=MODEL)
    submission.constraints.tools = ["charge_card"]
    store.tasks.create(submission, tenant="t", task_id=TASK_ID)
    ledger = tmp_path / "ledger.jsonl"

    killed = run_agentq(
        ["run-task", TASK_ID, "--lease", "1"],
        env=child_env(settings, AGENTQ_CRASH_AT=crash_at, AGENTQ_TEST_LEDGER=str(ledger), AGENTQ_MAX_CALL_SECONDS="1"),
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    before = store.steps.load(TASK_ID)
    held_at_kill = store.tasks.get(TASK_ID).inflight  # the killed worker's hold, if it held one
    assert len(before) == (1 if crash_at.startswith("after_llm_commit") else 0)

    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    resumed = run_task(TASK_ID, settings=settings, lease_seconds=1, wait_seconds=20)
    assert resumed.status is TaskStatus.SUCCEEDED, resumed

    after = store.steps.load(TASK_ID)
    assert after[: len(before)] == before
    assert [type(s.body) for s in after] == [LLMStep, ToolsStep, LLMStep]
    final = after[2].body
    assert isinstance(final, LLMStep) and final.text().startswith("done: charged 500 cents")
    charges = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(charges) == 1

    bodies = [r.body for r in server.requests]
    first_requests = [b for b in bodies if b["messages"][-1]["role"] == "user"]
    # Killed with the answer in hand: the resumed worker sent the very same request again.
    assert len(first_requests) == (2 if crash_at.startswith("after_llm_call") else 1)
    assert all(b == first_requests[0] for b in first_requests)
    # The resumed run may end before the dead worker's hold's deadline (the hold then stays
    # counted as reserved) or after it (then it is spent at claim): the release_holds message's
    # pass settles it either way once the deadline has passed.
    sweeper = Engine(store, worker_id="sweep", config=EngineConfig(lease_seconds=5))
    wait_for(lambda: sweeper.spend_lapsed_holds(store.tasks.get(TASK_ID)) == 0, timeout=30, what="the hold's deadline")
    budget = store.budgets.get(TASK_ID)
    committed = sum(s.body.usage.total for s in after if isinstance(s.body, LLMStep))
    assert budget.reserved == 0 and budget.used <= budget.cap
    if crash_at.startswith("after_llm_call"):
        lost = 200 + 20  # the answer the killed worker had in hand, never committed
        assert held_at_kill is not None and held_at_kill.amount >= lost
        assert budget.used == committed + held_at_kill.amount  # its hold was counted as spent, not returned
    else:
        assert budget.used == committed  # the answer was committed with its step: nothing was lost
