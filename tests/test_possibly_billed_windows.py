"""A failed attempt that may have been billed is counted as spent on every window that caps its
call, not only on the task's budget (ARCHITECTURE 4, "spend <= cap at every scope"): the
tenant's hour and the end user's day keep its hold at its size, as the budget keeps it as the
unknown, and the next attempt holds on them anew. So each window ends equal to the budget's
``used``, known and unknown alike. They used to keep one hold for the whole call, settled to the
last attempt's usage: a call cut once and then answered was counted on the budget as the cut
attempt's hold plus the answer, and on the windows as the answer alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from agentq.core.caps import CapLimits
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskSubmission
from agentq.core.tenancy import TenantLimits
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq.storage.tenant_windows import TenantWindows

from tests.fake_messages_api import FakeMessagesAPI, FakeReply, message_reply, point_anthropic_at, usage_dict

STORAGE = "memory"  # the windows' writes are the storage seam's; the conformance suite runs both backends


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMessagesAPI]:
    """The Anthropic provider against a local Messages API, not streamed (a cut reply tells
    nothing, so the whole hold is what may have been billed), two attempts a call, at once."""
    with FakeMessagesAPI() as server:
        point_anthropic_at(server, monkeypatch.setenv)
        monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "8192")
        monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", '{"max_attempts": 2, "base_delay": 0, "max_delay": 0}')
        yield server


def _answer() -> FakeReply:
    return message_reply([{"type": "text", "text": "done"}], usage=usage_dict(input_tokens=10, output_tokens=5))


@pytest.mark.parametrize("answered", [True, False], ids=["cut_then_answered", "cut_twice"])
def test_an_attempt_that_may_have_been_billed_stays_counted_on_the_tenants_hour_and_the_users_day(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, answered: bool
) -> None:
    windows = TenantWindows(store.table)
    windows.set_limits("t", TenantLimits(hourly_tokens=1_000_000, hourly_usd=Decimal(100)))
    store.caps.put("t", "user", "alice", CapLimits(daily_tokens=10**9, daily_usd=Decimal(100)))
    cut = dataclasses.replace(_answer(), cut_at=0.5)
    api.enqueue(cut, _answer() if answered else cut)
    submission = TaskSubmission.model_validate(
        {"goal": "answer in one turn", "provider": "anthropic", "user": "alice",
         "constraints": {"max_tokens": 5_000, "max_output_tokens": 400, "tools": []}}
    )  # fmt: skip
    task = store.tasks.create(submission, tenant="t")
    result = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30)).run(task.task_id)
    assert len(api.requests) == 2 and result.outcome == ("finished" if answered else "retry"), result
    budget = store.budgets.get(task.task_id)
    assert budget.reserved == 0 and budget.known == (15 if answered else 0), budget
    assert budget.unknown > 0 and budget.used == budget.known + budget.unknown, budget
    assert windows.usage("t") == {"held": budget.used, "used": budget.used}
    assert windows.money_usage("t") == {"held": budget.used_micros, "used": budget.used_micros}
    day = store.caps.usage("t", "user", "alice")
    assert (day["day_tokens"], day["day_used_tokens"]) == (budget.used, budget.used), day
    assert (day["day_usd"], day["day_used_usd"]) == (budget.used_micros, budget.used_micros), day


def test_a_retry_the_tenants_hour_cannot_cover_after_a_possibly_billed_attempt_is_not_made_and_holds_nothing(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry
) -> None:
    """The hour has room for one hold and a half: the cut attempt's stays counted on it, so the
    retry's cannot be taken there; no retry goes out and the budget's hold for it goes back."""
    probe = TaskSubmission.model_validate(
        {"goal": "answer in one turn", "provider": "anthropic", "constraints": {"max_tokens": 5_000,
                                                                                "max_output_tokens": 400, "tools": []}}
    )  # fmt: skip
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))
    api.enqueue(_answer())
    measured = store.tasks.create(probe, tenant="probe")
    assert engine.run(measured.task_id).outcome == "finished"
    hold = store.steps.load(measured.task_id)[0].body.reserved_tokens  # type: ignore[union-attr]
    windows = TenantWindows(store.table)
    windows.set_limits("t", TenantLimits(hourly_tokens=hold + hold // 2))
    api.enqueue(dataclasses.replace(_answer(), cut_at=0.5), _answer())
    task = store.tasks.create(probe, tenant="t")
    result = engine.run(task.task_id)
    assert api.pending == 1 and result.outcome == "retry", result  # the answer was never asked for
    budget = store.budgets.get(task.task_id)
    assert (budget.used, budget.unknown, budget.reserved) == (hold, hold, 0)
    assert windows.usage("t") == {"held": hold, "used": hold}
    assert store.tasks.get(task.task_id).inflight is None


def test_a_retry_noted_as_the_tasks_timeout_cuts_the_call_is_counted_once_on_the_budget_and_the_windows(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call's thread notes the retry of a cut attempt (its hold spent, the next held anew, on
    the budget and the windows) while the run cuts the call at the task's timeout (which spends
    the hold it finds, on both). The two take turns: the cut waits for the retry's holds and
    spends them, and no attempt follows it. Unordered, each could spend the same window hold,
    or the cut miss the one the retry took, left held: the windows then differ from the budget."""
    import importlib
    import threading

    from agentq.core.engine._llm_call import ModelCall

    importlib.import_module("agentq.core.providers.anthropic_provider")  # before the task's clock starts
    windows = TenantWindows(store.table)
    windows.set_limits("t", TenantLimits(hourly_tokens=1_000_000))
    cutting, cut = threading.Event(), ModelCall.cut

    def cut_noted(self: ModelCall, *args: Any) -> Any:
        cutting.set()
        return cut(self, *args)

    recorded = store.tasks.record_retry

    def recorded_once_the_cut_began(*args: Any, **kwargs: Any) -> None:
        assert cutting.wait(timeout=60), "the task's timeout never cut the call"
        recorded(*args, **kwargs)

    monkeypatch.setattr(ModelCall, "cut", cut_noted)
    monkeypatch.setattr(store.tasks, "record_retry", recorded_once_the_cut_began)
    api.enqueue(dataclasses.replace(_answer(), cut_at=0.5), _answer())
    submission = TaskSubmission.model_validate(
        {"goal": "answer in one turn", "provider": "anthropic",
         "constraints": {"max_tokens": 5_000, "max_output_tokens": 400, "tools": [], "timeout_seconds": 3}}
    )  # fmt: skip
    task = store.tasks.create(submission, tenant="t")
    result = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30)).run(task.task_id)
    assert result.status is not None and result.status.value == "timed_out", result
    assert len(api.requests) == 1  # no attempt after the cut
    budget = store.budgets.get(task.task_id)
    assert budget.reserved == 0 and budget.known == 0 and budget.used == budget.unknown > 0, budget
    assert windows.usage("t") == {"held": budget.used, "used": budget.used}
