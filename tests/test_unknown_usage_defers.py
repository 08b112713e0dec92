"""Issue 40, part 3: a budget is not exhausted by phantoms.

A hold counted as spent with its call's outcome unknown (a worker killed mid-call, a reply cut
in the middle) stays in ``used``, so ``used <= cap`` holds whatever the provider billed. But it
may never have been billed: when such holds are the only reason the next call does not fit,
the task is not ended ``cost_exceeded``. It is deferred with the reason (``unknown_usage``) and
looks again; a report of those calls, or a raise of the cap, lets it go on. When what the
provider reported fills the cap, the task ends ``cost_exceeded`` as before.
"""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus
from agentq.core.records import BudgetDelta
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.helpers import scripted

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
