"""Caps at every scope (core.caps, storage.scope_caps, core.engine._caps): a task acting for an
end user, running an agent or submitted with an API key holds each of its calls on that scope's
hourly and daily windows, in tokens and dollars. The engine's behaviour, on the in-memory twin
(the race between real processes is tests/test_scope_caps_race.py; the API, tests/test_caps_api.py)."""

from __future__ import annotations

import json
import logging
import time
from decimal import Decimal
from typing import Any

import pytest

from agentq.core.caps import CapLimits
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import CallStep, TaskStatus, TaskSubmission
from agentq.core.pricing import micros
from agentq.core.tools import ToolRegistry
from agentq.observe import names
from agentq.storage.container import Storage

from tests.helpers import call
from tests.test_observability import emf_documents, metric_total

STORAGE = "memory"
NOTES = "n" * 800  # ~200 output tokens a turn by the scripted provider's count
SCOPES = ("user", "agent", "key")
WINDOWS = (("hourly", "hour"), ("daily", "day"))


def _submission(turns: int, *, user: str | None = None, agent: str | None = None) -> TaskSubmission:
    script = [{"text": f"turn {i} {NOTES}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(turns)]
    raw: dict[str, Any] = {
        "goal": "spend", "provider": "scripted", "script": {"turns": [*script, {"text": "done"}]},
        "constraints": {"tools": ["lookup"], "max_steps": 200, "max_output_tokens": 300, "max_tokens": 10_000_000},
    }  # fmt: skip
    if user:
        raw["user"] = user
    if agent:
        raw["agent"] = agent
    return TaskSubmission.model_validate(raw)


def _create(store: Storage, scope: str, name: str, turns: int, tenant: str = "acme") -> str:
    sub = _submission(turns, user=name if scope == "user" else None, agent=name if scope == "agent" else None)
    return store.tasks.create(sub, tenant=tenant, key_id=name if scope == "key" else None).task_id


def _engine(store: Storage, registry: ToolRegistry) -> Engine:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))


def _decide(store: Storage, task_id: str, *, approved: bool) -> None:
    """A person's decision, as ``control.decide`` records it (here the test runs the task again
    itself instead of a queue's message)."""
    pending = store.approvals.pending(task_id)
    assert pending is not None
    store.approvals.decide(task_id, pending.use_id, approved=approved, note="", by="reviewer")


def _calls(store: Storage, task_id: str) -> list[CallStep]:
    return [s.body for s in store.steps.load(task_id) if isinstance(s.body, CallStep)]


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize(("prefix", "window"), WINDOWS)
@pytest.mark.parametrize("metric", ["tokens", "usd"])
def test_a_scope_cap_defers_the_task_before_a_call_could_pass_it_and_its_windows_count_exactly_what_was_used(
    store: Storage, registry: ToolRegistry, scope: str, prefix: str, window: str, metric: str
) -> None:
    cap: Any = 6_000 if metric == "tokens" else Decimal("0.03")
    store.caps.put("acme", scope, "alice", CapLimits.model_validate({f"{prefix}_{metric}": cap}))  # type: ignore[arg-type]
    task_id = _create(store, scope, "alice", turns=40)
    result = _engine(store, registry).run(task_id)

    assert result.outcome == "deferred" and result.error is not None
    assert result.error["code"] == "cap_reached" and result.error["scope"] == scope
    assert result.error["window"] == window and 0 < result.error["retry_after"] <= (3601 if window == "hour" else 86401)
    meta = store.tasks.get(task_id)
    assert meta.status is TaskStatus.RUNNING and meta.lease_expires == 0 and meta.inflight is None  # holds nothing
    calls = _calls(store, task_id)
    assert len(calls) >= 2
    tokens = sum(c.usage.total for c in calls)
    money = sum(micros(c.cost_usd) for c in calls)
    usage = store.caps.usage("acme", scope, "alice")  # type: ignore[arg-type]
    for w in ("hour", "day"):  # exact, on both windows, whichever is capped: holds settled to the usage
        assert usage[f"{w}_tokens"] == usage[f"{w}_used_tokens"] == tokens
        assert usage[f"{w}_usd"] == usage[f"{w}_used_usd"] == money
    spent = tokens if metric == "tokens" else money
    assert spent <= (cap if metric == "tokens" else micros(cap))
    assert store.budgets.get(task_id).reserved == 0


@pytest.mark.parametrize("scope", SCOPES)
def test_a_task_of_another_scope_or_another_tenant_is_not_held_by_the_cap(
    store: Storage, registry: ToolRegistry, scope: str
) -> None:
    store.caps.put("acme", scope, "alice", CapLimits(hourly_tokens=0))  # type: ignore[arg-type]
    for tenant, name in (("acme", "bob"), ("beta", "alice")):  # same tenant other name; same name other tenant
        task_id = _create(store, scope, name, turns=2, tenant=tenant)
        assert _engine(store, registry).run(task_id).status is TaskStatus.SUCCEEDED
        assert store.caps.usage(tenant, scope, name)["hour_tokens"] == 0  # type: ignore[arg-type]
    assert store.caps.usage("beta", scope, "alice")["day_tokens"] == 0  # type: ignore[arg-type]
    blocked = _create(store, scope, "alice", turns=2)
    assert _engine(store, registry).run(blocked).outcome == "deferred"  # the cap itself does hold its own


def test_every_scope_of_a_task_is_held_and_a_refusal_by_one_gives_back_the_others(
    store: Storage, registry: ToolRegistry
) -> None:
    store.caps.put("acme", "user", "alice", CapLimits(daily_tokens=1_000_000))
    store.caps.put("acme", "agent", "helper", CapLimits(hourly_tokens=1_000_000))
    store.caps.put("acme", "key", "k1", CapLimits(hourly_tokens=5_000))
    sub = _submission(40, user="alice", agent="helper")
    task_id = store.tasks.create(sub, tenant="acme", key_id="k1").task_id
    assert _engine(store, registry).run(task_id).outcome == "deferred"
    tokens = sum(c.usage.total for c in _calls(store, task_id))
    for scope, name in (("user", "alice"), ("agent", "helper"), ("key", "k1")):
        usage = store.caps.usage("acme", scope, name)  # type: ignore[arg-type]
        assert usage["day_tokens"] == usage["day_used_tokens"] == tokens  # the refused call's holds given back
    assert tokens <= 5_000


def test_a_soft_threshold_pauses_for_approval_then_the_task_goes_on_to_the_cap(
    store: Storage, registry: ToolRegistry
) -> None:
    store.caps.put("acme", "user", "alice", CapLimits(hourly_tokens=9_000, soft_hourly_tokens=3_000))
    task_id = _create(store, "user", "alice", turns=40)
    engine = _engine(store, registry)
    paused = engine.run(task_id)
    assert paused.status is TaskStatus.PAUSED
    asked = store.approvals.pending(task_id)
    assert asked is not None and asked.use_id.startswith("agentq-cap-user-hour-") and "soft threshold" in asked.question
    at_pause = store.caps.usage("acme", "user", "alice")
    assert at_pause["hour_tokens"] == at_pause["hour_used_tokens"] <= 3_000  # nothing held while it waits
    assert store.tasks.get(task_id).inflight is None

    _decide(store, task_id, approved=True)
    result = engine.run(task_id)
    assert result.outcome == "deferred" and result.error is not None and result.error["code"] == "cap_reached"
    after = store.caps.usage("acme", "user", "alice")
    assert 3_000 < after["hour_tokens"] == after["hour_used_tokens"] <= 9_000  # past the threshold, never the cap
    assert store.approvals.pending(task_id) is None  # asked once for the window


def test_a_rejected_soft_threshold_ends_the_task_cost_exceeded_naming_the_cap(
    store: Storage, registry: ToolRegistry
) -> None:
    store.caps.put("acme", "agent", "helper", CapLimits(daily_usd=Decimal(1), soft_daily_usd=Decimal("0.01")))
    task_id = _create(store, "agent", "helper", turns=40)
    engine = _engine(store, registry)
    assert engine.run(task_id).status is TaskStatus.PAUSED
    _decide(store, task_id, approved=False)
    result = engine.run(task_id)
    assert result.status is TaskStatus.COST_EXCEEDED
    error = store.tasks.get(task_id).error
    assert error is not None and "agent 'helper'" in error["message"] and "declined" in error["message"]
    assert store.caps.usage("acme", "agent", "helper")["day_usd"] <= micros(Decimal("0.01"))


@pytest.mark.parametrize(
    ("scope", "name", "user", "shown"),
    [
        ("user", "alice", "alice", True),  # the user's own window: its own spend
        ("agent", "helper", "alice", False),  # its agent's, which every user of the agent shares
        ("key", "k1", "alice", False),  # its key's, which every user the key acts for shares
        ("agent", "helper", None, True),  # no user: only the tenant's keys read the task
    ],
)
def test_a_caps_pause_and_deferral_name_what_the_window_holds_only_to_whom_that_spend_is_their_own(
    store: Storage, registry: ToolRegistry, scope: str, name: str, user: str | None, shown: bool
) -> None:
    """A cap's soft-threshold question and its refusal say "at N tokens", N what the scope's window
    holds; a user's task shows them to its end user's token (``pending_approval``, ``activity``,
    ``retry``, events, A2A, MCP). For a window the user shares (its agent's, its key's) N is other
    users' spend too, which ``GET /usage`` keeps from a token: those say the threshold or cap and
    this call's hold only. The user's own window, and a task no user's token reads, keep N."""
    store.caps.put("acme", scope, name, CapLimits(hourly_tokens=9_000, soft_hourly_tokens=3_000))  # type: ignore[arg-type]
    task_id = store.tasks.create(_submission(40, user=user, agent="helper"), tenant="acme", key_id="k1").task_id
    engine = _engine(store, registry)
    assert engine.run(task_id).status is TaskStatus.PAUSED
    asked = store.approvals.pending(task_id)
    assert asked is not None
    _decide(store, task_id, approved=True)
    deferred = engine.run(task_id)
    assert deferred.outcome == "deferred" and deferred.error is not None
    held = store.caps.usage("acme", scope, name)["hour_tokens"]  # type: ignore[arg-type]
    for said in (asked.question, deferred.error["message"]):
        assert f"{scope} {name!r}" in said and "this call holds " in said, said
        assert (" (at " in said) is shown, said
    assert (f"at {held} tokens" in deferred.error["message"]) is shown, (held, deferred.error)


def test_a_task_with_no_capped_scope_writes_no_window(store: Storage, registry: ToolRegistry) -> None:
    task_id = _create(store, "user", "carol", turns=2)
    assert _engine(store, registry).run(task_id).status is TaskStatus.SUCCEEDED
    assert store.caps.usage("acme", "user", "carol") == dict.fromkeys(store.caps.usage("acme", "user", "carol"), 0)


def _crossings(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    events = [json.loads(r.getMessage()) for r in caplog.records if r.name == "agentq.events"]
    return [e for e in events if e["event"] == "ScopeCapCrossed"]


def test_crossing_80_percent_of_a_cap_is_told_once_a_window_as_an_event_and_a_metric(
    store: Storage, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("AGENTQ_EMF", "1")
    store.caps.put("acme", "user", "alice", CapLimits(hourly_tokens=1_000, daily_tokens=2_000))
    caps = store.caps.applicable("acme", {"user": "alice"})
    ten = (int(time.time()) // 86_400 + 1) * 86_400 + 10 * 3_600  # 10:00 UTC tomorrow: the windows are the test's
    holds = [(ten, 700), (ten, 100), (ten, 50),  # the hour crosses 80 % at its second hold: told once
             (ten + 3_600, 800), (ten + 3_600, 100),  # a new hour crosses again, and the day crosses (1,650)
             (ten + 7_200, 100)]  # fmt: skip  # the day, past 80 % already, is not told again
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="agentq.events"):
        for at, amount in holds:
            store.caps.hold(caps, amount, now=at)
    docs = emf_documents(capsys.readouterr().out)
    told = [(e["window"], e["metric"], e["value"], e["cap"]) for e in _crossings(caplog)]
    assert told == [("hour", "tokens", 800, 1_000), ("hour", "tokens", 800, 1_000), ("day", "tokens", 1_650, 2_000)]
    assert all(e["tenant"] == "acme" and e["scope"] == "user" and e["name"] == "alice" for e in _crossings(caplog))
    assert metric_total(docs, names.SCOPE_CAP_CROSSED, service=names.EXECUTOR, scope="user") == 3


def test_tasks_spending_past_80_percent_of_a_cap_tell_it_once_however_many_calls_hold_past_it(
    store: Storage, registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    # Each task's one call holds ~1,000 tokens (600 of them the tool-use prompt its estimate
    # counts) and uses ~90: the cap holds one back only once several have spent 80 % of it.
    store.caps.put("acme", "agent", "helper", CapLimits(daily_tokens=6_000))
    spent = past = 0
    with caplog.at_level(logging.WARNING, logger="agentq.events"):
        for _ in range(100):  # one-call tasks of the agent, one after another, until the cap holds one back
            task_id = _create(store, "agent", "helper", turns=0)
            if _engine(store, registry).run(task_id).outcome == "deferred":
                break
            spent += sum(c.usage.total for c in _calls(store, task_id))
            past += spent >= 0.8 * 6_000  # a hold counts at least what its call and the earlier ones used
    assert past >= 2  # several holds were past 80 % of the cap
    told = _crossings(caplog)
    assert len(told) == 1, told
    assert told[0]["scope"] == "agent" and told[0]["name"] == "helper" and told[0]["window"] == "day"
    assert 0.8 * 6_000 <= told[0]["value"] <= 6_000


def _cut_or_failed(how: str) -> Any:
    """A provider factory whose one call is cut at the task's timeout (``cut``: it answers long
    after it) or fails after an attempt that may have been billed (``failed``)."""
    from agentq.core.errors import ProviderError
    from agentq.core.models import Script
    from agentq.core.providers.scripted import ScriptedProvider

    def factory(submission: TaskSubmission) -> Any:
        if how == "cut":
            return ScriptedProvider(Script.model_validate({"turns": [{"text": "late", "latency_seconds": 5}]}))

        class Provider:
            name = "scripted"

            def complete(self, request: Any) -> Any:
                raise ProviderError("the reply was cut midway", retryable=False, code="reply_cut", maybe_billed=True)

        return Provider()

    return factory


@pytest.mark.parametrize(("how", "ends"), [("cut", TaskStatus.TIMED_OUT), ("failed", TaskStatus.FAILED)])
def test_a_call_cut_or_failed_after_it_may_have_been_billed_keeps_its_hold_counted_on_every_window(
    store: Storage, registry: ToolRegistry, how: str, ends: TaskStatus
) -> None:
    """The budget counts such a call's hold as spent (its outcome unknown); the tenant's hour and
    the scopes' windows keep it the same way, through the one ``CallHold`` they were taken with."""
    from agentq.core.tenancy import TenantLimits
    from agentq.storage.tenant_windows import TenantWindows

    windows = TenantWindows(store.table)
    windows.set_limits("acme", TenantLimits(hourly_tokens=10_000_000))
    store.caps.put("acme", "user", "alice", CapLimits(daily_tokens=10_000_000))
    raw = _submission(0, user="alice").model_dump(exclude_none=True)
    raw["constraints"]["timeout_seconds"] = 1
    sub = TaskSubmission.model_validate(raw)
    task_id = store.tasks.create(sub, tenant="acme").task_id
    engine = Engine(
        store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30), providers=_cut_or_failed(how)
    )
    result = engine.run(task_id)

    assert result.status is ends, result
    budget = store.budgets.get(task_id)
    assert budget.unknown > 0 and budget.used == budget.unknown and budget.reserved == 0, budget
    usage = store.caps.usage("acme", "user", "alice")
    assert usage["day_tokens"] == usage["day_used_tokens"] == budget.unknown  # kept at its hold, as the budget did
    assert windows.usage("acme") == {"held": budget.unknown, "used": budget.unknown}
