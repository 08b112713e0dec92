"""Issue 40, part 3: a budget is not exhausted by phantoms.

A hold counted as spent with its call's outcome unknown (a worker killed mid-call, a reply cut
in the middle) stays in ``used``, so ``used <= cap`` holds whatever the provider billed. But it
may never have been billed: when such holds are the only reason the next call does not fit,
the task is not ended ``cost_exceeded``. It is deferred with the reason (``unknown_usage``) and
looks again; a report of those calls, or a raise of the cap, lets it go on. When what the
provider reported fills the cap, the task ends ``cost_exceeded`` as before.

The same holds of a lost worker's hold set aside at claim (its call could still complete) whose
deadline passes during the run: it is counted as spent at the next call's reservation, and
weighed there as unknown, not as held (``make chaos`` found such a task ended ``cost_exceeded``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from decimal import Decimal

import pytest

from agentq.core.engine import Engine, EngineConfig, RunResult
from agentq.core.engine._holds import MIN_OUTPUT_TOKENS
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission
from agentq.core.pricing import ModelPrice, dollars, load_price_table, micros
from agentq.core.records import BudgetDelta
from agentq.core.tools import ToolRegistry, tool
from agentq.storage.container import Storage

from tests.helpers import call, scripted, wait_for

STORAGE = "memory"  # the engine's own behaviour: the in-memory twin (tests/storage_conformance)
CAP = 5_000
RECHECK = 7.0


def _engine(store: Storage, registry: ToolRegistry) -> Engine:
    config = EngineConfig(lease_seconds=5, unknown_recheck_seconds=RECHECK)
    return Engine(store, worker_id="w2", tools=registry, config=config)


def _with_a_spent_hold(store: Storage, hold: int) -> str:
    """A task whose first worker died mid-call: its hold of ``hold`` tokens was counted as spent
    at its deadline, its outcome unknown."""
    task = store.tasks.create(scripted([{"text": "done"}], max_tokens=CAP), tenant="t")
    claim = store.tasks.claim(task.task_id, "dead", 30)
    assert claim is not None
    held = store.budgets.reserve(claim[0], task.task_id, hold, 1, until=time.time() + 60)
    store.tasks.release(claim[0])
    assert store.budgets.spend_lapsed(task.task_id, task.task_id, held)
    return task.task_id


def _report(store: Storage, task_id: str, hold: int, used: int) -> None:
    """The dead worker's call is reported after all (a woken zombie): ``used`` tokens billed."""
    delta = BudgetDelta(reserved=hold, used=used, cost_usd=Decimal(0), tokens_in=used, tokens_out=0)
    store.budgets.settle_orphan(task_id, task_id, delta, inflight_epoch=1)


@pytest.mark.parametrize("hold", [CAP - 10, CAP // 2 + 1, CAP - 1_000])
def test_a_task_blocked_only_by_unknown_holds_waits_with_the_reason_and_goes_on_once_they_are_reported(
    store: Storage, registry: ToolRegistry, hold: int
) -> None:
    task_id = _with_a_spent_hold(store, hold)
    before = store.budgets.get(task_id)
    engine = _engine(store, registry)
    result = engine.run(task_id)
    assert result.outcome == "deferred", result
    assert result.error is not None and result.error["code"] == "unknown_usage"
    assert result.error["retry_after"] == RECHECK
    assert f"{hold} tokens" in result.error["message"]
    task = store.tasks.get(task_id)
    assert task.status is not TaskStatus.COST_EXCEEDED and task.inflight is None
    after = store.budgets.get(task_id)
    assert (after.used, after.reserved, after.unknown) == (before.used, 0, hold)  # nothing held, nothing lost

    _report(store, task_id, hold, used=0)  # never billed: the provider refused it before a byte
    result = engine.run(task_id)
    assert result.status is TaskStatus.SUCCEEDED, result
    assert store.budgets.get(task_id).unknown == 0


def test_a_raise_of_the_cap_lets_a_task_blocked_by_unknown_holds_go_on(store: Storage, registry: ToolRegistry) -> None:
    task_id = _with_a_spent_hold(store, CAP - 10)
    engine = _engine(store, registry)
    assert engine.run(task_id).outcome == "deferred"
    store.budgets.raise_cap(task_id, CAP)
    assert engine.run(task_id).status is TaskStatus.SUCCEEDED
    assert store.budgets.get(task_id).unknown == CAP - 10  # still unknown: no one reported it


def test_a_cap_filled_by_reported_usage_ends_the_task_cost_exceeded(store: Storage, registry: ToolRegistry) -> None:
    task_id = _with_a_spent_hold(store, CAP - 10)
    _report(store, task_id, CAP - 10, used=CAP - 10)  # billed in full, and known
    result = _engine(store, registry).run(task_id)
    assert result.status is TaskStatus.COST_EXCEEDED, result
    assert result.error is not None and result.error["code"] == "budget_exceeded"


# A hold set aside as lapsed at claim (its lost worker's call could still complete) that is
# counted as spent during the run, at the next call's reservation: the unknown it becomes is
# weighed there too (before, that reservation weighed it as still held, and ended the task).
WAITER = "wait_out_the_lost_call"
OUT = 64  # the calls' output allowance: small, so a hold is mostly its input estimate
TURNS: list[object] = [{"text": "", "tool_calls": [call(WAITER)]}, {"text": "done"}]


def _waiting_until(until: float) -> ToolRegistry:
    """A tool that returns once ``until`` (the lost worker's hold's deadline) has passed, always
    with the same text: the conversation, and so every estimate, is the same however long."""

    @tool(name=WAITER, timeout_seconds=30)
    def wait_out_the_lost_call() -> str:
        """Waits until the lost worker's call can no longer complete."""
        wait_for(lambda: time.time() >= until, timeout=20, what="the lost worker's hold's deadline")
        return "its call is over"

    return ToolRegistry([wait_out_the_lost_call])


def _submission(cap: int = 1_000_000, usd_micros: int | None = None) -> TaskSubmission:
    money = {} if usd_micros is None else {"max_cost_usd": dollars(usd_micros)}
    return scripted(TURNS, tools=[WAITER], max_tokens=cap, max_output_tokens=OUT, **money)


@dataclass(frozen=True)
class Sizes:
    """The engine's own sizes for ``TURNS``, from a run on an ample budget: the two calls'
    holds (each step's ``reserved_tokens``: its input estimate + ``OUT``, as nothing near a cap
    shortened them), the first call's usage, and the hold's price in millionths of a dollar."""

    h1: int
    u1: int
    e2: int
    h2: int
    first: LLMStep
    price: ModelPrice

    @property
    def e1(self) -> int:
        return self.h1 - OUT


def _measured(store: Storage) -> Sizes:
    task = store.tasks.create(_submission(), tenant="t")
    assert _engine(store, _waiting_until(0.0)).run(task.task_id).status is TaskStatus.SUCCEEDED
    first, second = (r.body for r in store.steps.load(task.task_id) if isinstance(r.body, LLMStep))
    assert store.budgets.get(task.task_id).used == first.usage.total + second.usage.total
    price = load_price_table().dearest([task.submission.model])
    assert price is not None
    h1, h2 = first.reserved_tokens, second.reserved_tokens
    return Sizes(h1, first.usage.total, h2 - OUT, h2, first, price)


def _run_past_a_lost_hold(
    store: Storage, submission: TaskSubmission, lost: int, micros: int = 0
) -> tuple[str, RunResult]:
    """Run a task whose lost worker left a hold of ``lost`` tokens (``micros`` millionths of a
    dollar) whose deadline is two seconds ahead: set aside at claim (its call may still
    complete), it lapses while the first turn's tool waits, and is counted as spent (unknown)
    at the second call's reservation."""
    task = store.tasks.create(submission, tenant="t")
    claim = store.tasks.claim(task.task_id, "lost", 30)
    assert claim is not None
    until = time.time() + 2.0
    store.budgets.reserve(claim[0], task.task_id, lost, 1, until=until, micros=micros)
    store.tasks.release(claim[0])  # the lease lapses; the call under the hold may be in flight
    return task.task_id, _engine(store, _waiting_until(until)).run(task.task_id)


@pytest.mark.parametrize("end", ["least", "most"])
def test_a_hold_that_lapses_during_the_run_and_alone_blocks_the_next_call_defers_it_as_unknown_usage(
    store: Storage, end: str
) -> None:
    """Sizes (from ``_measured``: holds H1, H2, the first call's usage U1, the second's input
    estimate E2): the cap is U1 + H2, so the second call fits in full were the lost hold L
    unbilled. L is at least OUT - 15, so while L counts the second call has less than
    E2 + MIN_OUTPUT_TOKENS (no shortened hold either), and at most U1 + H2 - H1, so the first
    call's full hold fits beside the live L. Both ends of that range: the task waits with
    ``unknown_usage`` naming L, never ``cost_exceeded``."""
    m = _measured(store)
    cap, least, most = m.u1 + m.h2, OUT - MIN_OUTPUT_TOKENS + 1, m.u1 + m.h2 - m.h1
    assert 0 < least <= most, m
    lost = least if end == "least" else most
    task_id, result = _run_past_a_lost_hold(store, _submission(cap), lost)
    assert result.outcome == "deferred", result
    assert result.error is not None and result.error["code"] == "unknown_usage"
    assert f"{lost} tokens" in result.error["message"]
    budget = store.budgets.get(task_id)
    assert (budget.used, budget.unknown, budget.reserved) == (m.u1 + lost, lost, 0)
    assert store.tasks.get(task_id).status is not TaskStatus.COST_EXCEEDED


@pytest.mark.parametrize("end", ["least", "most"])
def test_a_money_hold_that_lapses_during_the_run_and_alone_blocks_the_next_call_defers_it_as_unknown_usage(
    store: Storage, end: str
) -> None:
    """The same in dollars (tokens ample), in millionths: the money cap is C1 + P(E2, OUT), the
    first call's cost and the second's full hold at the engine's price P (``hold_micros``). The
    lost hold (one token) is at least P(E2, OUT) - P(E2, MIN_OUTPUT_TOKENS) + 1, so while it
    counts not even the shortest second call is affordable, and at most C1 + P(E2, OUT) -
    P(E1, OUT), so the first call's full hold fits beside it."""
    m = _measured(store)
    c1 = micros(m.first.cost_usd)
    full2, short2, full1 = (m.price.hold_micros(m.e2, OUT), m.price.hold_micros(m.e2, MIN_OUTPUT_TOKENS),
                            m.price.hold_micros(m.e1, OUT))  # fmt: skip
    cap, least, most = c1 + full2, full2 - short2 + 1, c1 + full2 - full1
    assert 0 < least <= most, (m, c1, full2, short2, full1)
    lost = least if end == "least" else most
    task_id, result = _run_past_a_lost_hold(store, _submission(usd_micros=cap), 1, micros=lost)
    assert result.outcome == "deferred", result
    assert result.error is not None and result.error["code"] == "unknown_usage"
    assert f"${dollars(lost):.6f}" in result.error["message"]
    budget = store.budgets.get(task_id)
    assert (budget.used_micros, budget.unknown_micros, budget.reserved_micros) == (c1 + lost, lost, 0)


def test_a_hold_that_lapses_during_the_run_does_not_defer_a_task_whose_reported_usage_fills_the_cap(
    store: Storage,
) -> None:
    """The control: the cap is U1 + E2 + MIN_OUTPUT_TOKENS - 1, so after the first call not
    even the shortest second call fits with the lost hold unbilled; the lost hold is the most
    the first call's full hold leaves room for. What the provider reported fills the cap: the
    task ends ``cost_exceeded``."""
    m = _measured(store)
    cap = m.u1 + m.e2 + MIN_OUTPUT_TOKENS - 1
    lost = cap - m.h1
    assert lost > 0, m
    task_id, result = _run_past_a_lost_hold(store, _submission(cap), lost)
    assert result.status is TaskStatus.COST_EXCEEDED, result
    assert result.error is not None and result.error["code"] == "budget_exceeded"
    assert store.budgets.get(task_id).unknown == lost


def test_the_tasks_view_says_which_part_of_its_budget_is_known_and_which_unknown(
    store: Storage, registry: ToolRegistry
) -> None:
    from agentq.api.views import task_view
    from agentq.cli.views import budget_line

    task_id = _with_a_spent_hold(store, 1_234)
    view = task_view(store, store.tasks.get(task_id))
    assert view.budget is not None
    assert (view.budget.used, view.budget.known, view.budget.unknown) == (1_234, 0, 1_234)
    assert "1,234 of them unknown" in budget_line(view)
    _report(store, task_id, 1_234, used=300)
    view = task_view(store, store.tasks.get(task_id))
    assert view.budget is not None
    assert (view.budget.used, view.budget.known, view.budget.unknown) == (300, 300, 0)
    assert "unknown" not in budget_line(view)


@pytest.mark.parametrize("raw", ["0", "-5", "901", "soon", "nan"])
def test_a_bad_recheck_interval_is_refused_naming_its_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    from agentq.control.defaults import ConfigurationError
    from agentq.runtime import UNKNOWN_RECHECK_VARIABLE, unknown_recheck_seconds

    monkeypatch.setenv(UNKNOWN_RECHECK_VARIABLE, raw)
    with pytest.raises(ConfigurationError, match=UNKNOWN_RECHECK_VARIABLE):
        unknown_recheck_seconds()
