"""Per-tenant hourly token windows: hard cap refuses new reservations, soft cap at 80% emits
a metric and an event, and the window counts exactly the provider-reported usage. The engine's
behaviour, so on the in-memory twin (the windows' conditional writes are in the conformance suite)."""

from __future__ import annotations

import json
import logging
from decimal import Decimal

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import LLMStep, TaskStatus
from agentq.core.pricing import micros
from agentq.core.tenancy import TenantLimits
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq.storage.tenant_windows import TenantWindows, seconds_to_next_hour

from tests.helpers import call, scripted

TURNS = [{"text": f"turn {i}", "tool_calls": [call("lookup", query=str(i), size=400)]} for i in range(8)] + [
    {"text": "done"}
]


# The engine's own behaviour needs no AWS. ``store`` and ``registry`` (tests/conftest.py) are the in-memory twin's;
# tests that race processes or use queues ask for ``settings`` and build their own.
STORAGE = "memory"


def _engine(store: Storage, registry: ToolRegistry) -> Engine:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5))


def test_the_hard_cap_refuses_new_reservations_until_the_next_hour(store: Storage, registry: ToolRegistry) -> None:
    windows = TenantWindows(store.table)
    windows.set_limits("acme", TenantLimits(hourly_tokens=6_000))
    task = store.tasks.create(scripted(TURNS, tools=["lookup"], max_output_tokens=300), tenant="acme")
    result = _engine(store, registry).run(task.task_id)
    assert result.outcome == "retry" and result.error is not None
    assert result.error["code"] == "tenant_hourly_cap" and 0 < result.error["retry_after"] <= 3601
    meta = store.tasks.get(task.task_id)
    assert meta.status is TaskStatus.RUNNING and meta.lease_expires == 0 and meta.inflight is None  # nothing held
    usage = windows.usage("acme")
    spent = sum(s.body.usage.total for s in store.steps.load(task.task_id) if isinstance(s.body, LLMStep))
    assert usage == {"held": spent, "used": spent}  # exact: holds were settled to the reported usage
    assert spent <= 6_000
    assert store.budgets.get(task.task_id).reserved == 0


def test_crossing_the_soft_cap_emits_a_metric_and_an_event(
    store: Storage, registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    windows = TenantWindows(store.table)
    windows.set_limits("beta", TenantLimits(hourly_tokens=12_000, soft_ratio=0.5))
    task = store.tasks.create(scripted(TURNS, tools=["lookup"], max_output_tokens=300), tenant="beta")
    with caplog.at_level(logging.WARNING, logger="agentq.events"):
        _engine(store, registry).run(task.task_id)
    events = [json.loads(r.getMessage()) for r in caplog.records if r.name == "agentq.events"]
    assert len(events) == 1  # crossed once, reported once
    assert (
        events[0]["event"] == "TenantSoftCapCrossed"
        and events[0]["tenant"] == "beta"
        and events[0]["hourly_cap"] == 12_000
    )
    assert events[0]["tokens_this_hour"] >= 6_000


def test_a_tenant_without_limits_writes_no_window(store: Storage, registry: ToolRegistry) -> None:
    task = store.tasks.create(scripted(TURNS, tools=["lookup"]), tenant="free")
    assert _engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert TenantWindows(store.table).usage("free") == {"held": 0, "used": 0}


def test_the_retry_comes_back_at_the_next_hour() -> None:
    assert seconds_to_next_hour(7200.0) == 3601 and seconds_to_next_hour(7199.0) == 2


def test_the_money_cap_refuses_a_call_that_could_take_the_hour_past_it(store: Storage, registry: ToolRegistry) -> None:
    windows = TenantWindows(store.table)
    windows.set_limits("cash", TenantLimits(hourly_usd=Decimal("0.02")))
    assert windows.limits("cash") == TenantLimits(hourly_usd=Decimal("0.02"))
    task = store.tasks.create(scripted(TURNS, tools=["lookup"], max_output_tokens=300), tenant="cash")
    result = _engine(store, registry).run(task.task_id)
    assert result.outcome == "retry" and result.error is not None
    assert result.error["code"] == "tenant_hourly_cap" and "$0.02" in result.error["message"]
    calls = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, LLMStep)]
    spent = sum(micros(c.cost_usd) for c in calls)
    assert len(calls) >= 2 and windows.money_usage("cash") == {"held": spent, "used": spent} and spent <= 20_000
    with pytest.raises(ValueError, match="at least one cap"):
        TenantLimits()
