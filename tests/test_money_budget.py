"""Money budgets (``max_cost_usd``): reserved before each call at the most it can cost and
settled at what it did, in the same writes as tokens, so ``used <= cap`` holds in dollars too;
the ledger's spend equals the calls' priced cost; a model without a price is refused.

The engine's behaviour runs on the in-memory twin (``store``, ``registry``); twenty processes
racing for the money cap run on moto server (``settings``, ``settings_store``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentq.api.views import task_view
from agentq.control.submit import check_submission, parse_submission
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ValidationError
from agentq.core.models import CallStep, TaskStatus
from agentq.core.pricing import load_price_table, micros
from agentq.core.tools import ToolRegistry
from agentq.runtime import Settings
from agentq.storage.container import Storage

from tests.budget_racer import race
from tests.helpers import call, scripted

STORAGE = "memory"
NOTES = "n" * 800  # ~200 output tokens a turn by the scripted provider's count


def _long_task(cap: str, turns: int = 40) -> dict[str, object]:
    script = [{"text": f"turn {i} {NOTES}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(turns)]
    return {"goal": "spend", "provider": "scripted", "script": {"turns": script},
            "constraints": {"tools": ["lookup"], "max_steps": 100, "max_output_tokens": 500, "max_tokens": 2_000_000,
                            "max_cost_usd": cap}}  # fmt: skip


def test_a_money_cap_ends_the_task_before_a_call_could_take_it_past_the_cap(
    store: Storage, registry: ToolRegistry
) -> None:
    submission = parse_submission(_long_task("0.025"))
    assert submission.constraints.max_cost_usd == Decimal("0.025")
    task = store.tasks.create(submission, tenant="t")
    result = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30)).run(task.task_id)

    assert result.status is TaskStatus.COST_EXCEEDED
    final = store.tasks.get(task.task_id)
    assert final.error is not None and final.error["code"] == "budget_exceeded"
    assert "money budget" in final.error["message"] and "$0.025" in final.error["message"]
    calls = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, CallStep)]
    assert len(calls) >= 3  # it ran until the money, not the tokens, ran out
    budget = store.budgets.get(task.task_id)
    assert budget.cap_micros == 25_000 and budget.reserved_micros == 0
    assert budget.used_micros == sum(micros(c.cost_usd) for c in calls) <= budget.cap_micros
    assert final.cost_usd == sum(c.cost_usd for c in calls) <= Decimal("0.025")
    assert budget.used < budget.cap  # tokens were left

    view = task_view(store, final)
    assert view.budget is not None and view.budget.money is not None
    assert view.budget.money.cap_usd == "0.025000" and Decimal(view.budget.money.used_usd) <= Decimal("0.025")


def test_a_cap_a_call_fits_leaves_the_task_alone_and_the_ledger_holds_its_cost(
    store: Storage, registry: ToolRegistry
) -> None:
    task = store.tasks.create(parse_submission(_long_task("5", turns=4)), tenant="t")
    result = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30)).run(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED
    calls = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, CallStep)]
    budget = store.budgets.get(task.task_id)
    assert budget.used_micros == sum(micros(c.cost_usd) for c in calls) > 0
    assert budget.reserved_micros == 0 and budget.available_micros == budget.cap_micros - budget.used_micros


def test_a_money_cap_on_a_model_without_a_price_or_out_of_range_is_refused_naming_the_field(
    registry: ToolRegistry,
) -> None:
    unpriced = parse_submission({**_long_task("1"), "model": "mystery-model-1"})
    with pytest.raises(ValidationError) as refused:
        check_submission(unpriced, registry)
    assert refused.value.field == "constraints.max_cost_usd" and "no price for 'mystery-model-1'" in str(refused.value)
    check_submission(parse_submission({**_long_task("1"), "constraints": {}, "model": "mystery-model-1"}), registry)
    for bad in ("0", "-1", "0.0000001", "2000000", "lots"):
        with pytest.raises(ValidationError) as invalid:
            parse_submission(_long_task(bad))
        assert invalid.value.field == "constraints.max_cost_usd", bad


def test_a_hold_is_the_most_a_call_can_cost() -> None:
    price = load_price_table().price_for("claude-sonnet-4-6")
    assert price is not None
    # 1,000 input tokens at the 1-hour cache-write rate ($6/M) + 500 output at $15/M = $0.0135
    assert price.hold_micros(1000, 500) == 13_500
    assert micros(Decimal("0.0000001")) == 1  # rounded up, never under


PROCESSES = 20
HOLD_MICROS = 700
ATTEMPTS = 4
CAP_MICROS = 20_000  # demand is 56,000 millionths: almost three times the cap


def test_twenty_processes_reserving_money_at_once_never_push_the_root_past_its_money_cap(
    settings: Settings, settings_store: Storage
) -> None:
    store = settings_store
    root = store.tasks.create(
        scripted([{"text": "root"}], max_tokens=10_000_000, max_cost_usd=Decimal(CAP_MICROS) / 1_000_000), tenant="t"
    )
    children = [
        store.tasks.create(
            scripted([{"text": "child"}]), tenant="t", root_id=root.task_id, parent_id=root.task_id, depth=1
        )
        for _ in range(PROCESSES)
    ]
    reports = race(settings, root.task_id, [c.task_id for c in children], 10, ATTEMPTS, HOLD_MICROS)

    granted = sum(r["granted"] for r in reports)
    budget = store.budgets.get(root.task_id)
    assert granted == CAP_MICROS // HOLD_MICROS  # as many as fit, and no lost update
    assert budget.used_micros == sum(r["used_micros"] for r in reports) <= CAP_MICROS
    assert budget.reserved_micros == 0 and budget.available_micros == CAP_MICROS - budget.used_micros
    assert sum(1 for r in reports if r["granted"] < ATTEMPTS) > 0  # there really was contention


def test_sub_agents_get_the_part_of_the_money_their_token_share_is(store: Storage) -> None:
    from agentq.core.fanout import parse_spawn_input, plan_children

    root = store.tasks.create(parse_submission({**_long_task("0.50"), "constraints": {
        "tools": ["spawn_subagents"], "max_tokens": 100_000, "max_cost_usd": "0.50"}}), tenant="t")  # fmt: skip
    spec = parse_spawn_input({"subagents": [
        {"goal": "a", "token_share": 50_000, "script": {"turns": [{"text": "a"}]}},
        {"goal": "b", "token_share": 25_000, "script": {"turns": [{"text": "b"}]}},
    ]})  # fmt: skip
    plans = plan_children(root, "toolu_x", spec, 100_000, available_micros=500_000)
    assert [p.share_micros for p in plans] == [250_000, 125_000]
    assert [p.submission.constraints.max_cost_usd for p in plans] == [Decimal("0.25"), Decimal("0.125")]
    with pytest.raises(Exception, match="money budget has"):
        plan_children(root, "toolu_y", spec, 100_000, available_micros=1)


class _Queues:
    """Stands in for TaskQueues: a raise requeues the task; here the test runs it itself."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, task_id: str, priority: Any, **_: Any) -> None:
        self.sent.append(task_id)


def test_raising_the_money_cap_resumes_a_task_that_ran_out_and_a_task_without_one_is_refused(
    store: Storage, registry: ToolRegistry
) -> None:
    from agentq.control.operations import raise_budget

    queues: Any = _Queues()
    task = store.tasks.create(parse_submission(_long_task("0.025")), tenant="t")
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))
    assert engine.run(task.task_id).status is TaskStatus.COST_EXCEEDED
    steps_before = store.tasks.get(task.task_id).step

    raised = raise_budget(store, queues, task.task_id, add_tokens=0, add_usd=Decimal("5"))
    assert raised.status is TaskStatus.QUEUED and raised.submission.constraints.max_cost_usd == Decimal("5.025")
    assert queues.sent == [task.task_id]
    assert store.budgets.get(task.task_id).cap_micros == 5_025_000
    resumed = engine.run(task.task_id)
    assert resumed.status is TaskStatus.SUCCEEDED and resumed.resumed_from_step == steps_before
    calls = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, CallStep)]
    assert store.budgets.get(task.task_id).used_micros == sum(micros(c.cost_usd) for c in calls)

    plain = store.tasks.create(scripted([{"text": "hi"}]), tenant="t")
    with pytest.raises(ValidationError) as refused:
        raise_budget(store, queues, plain.task_id, add_tokens=0, add_usd=Decimal("1"))
    assert refused.value.field == "add_usd"


def test_a_budget_raise_and_a_message_raise_at_once_both_raise_the_money_and_step_caps(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POST /budget`` raised the caps of the submission it read, and put it with only a status
    condition: a message's raise accepted between its read and its write was undone. It now
    raises the submission as its write reads it, put only while it is still that one."""
    from agentq.control.conversations import send_message
    from agentq.control.operations import raise_budget

    queues: Any = _Queues()
    task = store.tasks.create(parse_submission(_long_task("0.02")), tenant="t")
    store.tasks.claim(task.task_id, "w", 30)  # running: both raises wait for its next turn
    replace = store.tasks.replace_submission

    def after_a_message(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(store.tasks, "replace_submission", replace)  # once
        send_message(store, queues, task.task_id, "more", tenant="t", add_steps=5, add_usd=Decimal("1"))
        return replace(*args, **kwargs)

    monkeypatch.setattr(store.tasks, "replace_submission", after_a_message)  # after raise_budget's read
    raise_budget(store, queues, task.task_id, add_tokens=0, add_steps=5, add_usd=Decimal("2"))

    constraints = store.tasks.get(task.task_id).submission.constraints
    assert (constraints.max_steps, constraints.max_cost_usd) == (110, Decimal("3.02"))
    assert store.budgets.get(task.task_id).cap_micros == 3_020_000  # the ledger's caps: both, as before
