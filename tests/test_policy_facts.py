"""What a policy rule sees of a call (core.engine._policy, docs/POLICIES.md "What a rule sees"),
and what reading it costs: the real engine on the in-memory twin, with rules stored as
``agentq policy put`` stores them and DynamoDB's calls counted on the twin's table.
The rules over real HTTP and worker processes are tests/test_policies.py."""

from __future__ import annotations

import collections
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from agentq.core.caps import CapLimits
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import CallStep, TaskStatus, TaskSubmission, ToolsStep
from agentq.core.policies import check
from agentq.core.policies import request as cedar_request
from agentq.core.pricing import micros
from agentq.core.tools import ToolRegistry
from agentq.storage import keys
from agentq.storage.container import Storage

from tests.helpers import call

STORAGE = "memory"
TENANT = "acme"


class TableCalls:
    """The twin's table requests, each with the keys it names (a GetItem's, an UpdateItem's...),
    so a test counts the calls one kind of item costs, as bench/cap_calls.py counts them on
    DynamoDB."""

    OPS = ("get", "batch_get", "query", "update", "put", "transact", "delete")

    def __init__(self, store: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[str, str]] = []
        for op in self.OPS:
            monkeypatch.setattr(store.table, op, self._counted(op, getattr(store.table, op)))

    def _counted(self, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.seen.append((op, repr(args)))
            return fn(*args, **kwargs)

        return counted

    def of(self, marker: str) -> dict[str, int]:
        """The calls whose keys name ``marker`` (a key prefix, a task id), by operation."""
        return dict(collections.Counter(op for op, wire in self.seen if marker in wire))


def _put(store: Storage, text: str, scope: str = "tenant") -> None:
    store.policies.put(TENANT, scope, text, check(text).digest)


def _submission(turns: int = 2, **fields: Any) -> TaskSubmission:
    script = [{"text": f"turn {i}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(turns - 1)]
    raw: dict[str, Any] = {
        "goal": "g", "provider": "scripted", "script": {"turns": [*script, {"text": "done"}]},
        "constraints": {"tools": ["lookup"], "max_tokens": 1_000_000, "max_cost_usd": "5", "max_output_tokens": 64},
        **fields,
    }  # fmt: skip
    return TaskSubmission.model_validate(raw)


def _engine(store: Storage, registry: ToolRegistry) -> Engine:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=10, policy_cache_seconds=0))


def _run(
    store: Storage, registry: ToolRegistry, sub: TaskSubmission, user_field: str | None = None, **create: Any
) -> tuple[str, Any]:
    if user_field is not None:  # the end user the task acts for (``submission.user``)
        sub = sub.model_copy(update={"user": user_field})
    task = store.tasks.create(sub, tenant=TENANT, **create)
    return task.task_id, _engine(store, registry).run(task.task_id)


def test_a_rule_that_names_the_trees_spend_only_in_a_comment_costs_no_read_of_the_trees_budget(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a rule set reads is decided from the parsed rules: a comment or a string spelling
    ``tree_tokens`` is not a read; an access is, at every check (3 here: 2 model calls, 1 tool)."""
    _put(store, '@id("c") forbid(principal, action == Action::"spawn", resource); // not tree_tokens')
    calls = TableCalls(store, monkeypatch)
    task_id, result = _run(store, registry, _submission())
    assert result.status is TaskStatus.SUCCEEDED, result.error
    budget_reads = calls.of(str(keys.meta_key(task_id)["pk"])).get("get", 0)

    _put(
        store,
        '@id("c") forbid(principal, action == Action::"spawn", resource) when { context.history.tree_tokens > 0 };',
    )
    calls.seen.clear()
    task_id, result = _run(store, registry, _submission())
    assert result.status is TaskStatus.SUCCEEDED, result.error
    assert calls.of(str(keys.meta_key(task_id)["pk"])).get("get", 0) == budget_reads + 3


def _seen_requests(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every Cedar request the engine's checks make: what a rule sees, call by call."""
    from agentq.core.engine import _policy

    seen: list[dict[str, Any]] = []

    def recorded(*args: Any) -> dict[str, Any]:
        made = cedar_request(*args)
        seen.append(made)
        return made

    monkeypatch.setattr(_policy, "cedar_request", recorded)
    return seen


def _holds(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[int, int]]:
    """The tokens and money each model call was sent under (its hold as the call goes out), by step."""
    from agentq.core.engine._holds import BudgetHolds

    sent: dict[int, tuple[int, int]] = {}
    cover = BudgetHolds.cover

    def recorded(self: BudgetHolds, s: Any, start: float) -> None:
        held = s.task.inflight
        sent[s.next_step] = (held.amount, held.micros)
        cover(self, s, start)

    monkeypatch.setattr(BudgetHolds, "cover", recorded)
    return sent


def test_a_model_calls_estimate_is_what_its_hold_takes_from_the_first_call_on(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``call.estimated_tokens`` and ``call.estimated_usd_micros`` are the call's hold, the first
    call of a run included (it was 0 there: no hold yet), so a rule on the estimate stops the very
    first call before anything is sent."""
    _put(store, '@id("see") @mode("log_only") forbid(principal, action == Action::"model", resource);')
    seen, holds = _seen_requests(monkeypatch), _holds(monkeypatch)
    _, result = _run(store, registry, _submission(turns=2))
    assert result.status is TaskStatus.SUCCEEDED, result.error
    estimates = {
        r["context"]["task"]["step"]: (
            r["context"]["call"]["estimated_tokens"],
            r["context"]["call"]["estimated_usd_micros"],
        )
        for r in seen
        if r["action"]["id"] == "model"
    }
    assert sorted(estimates) == [1, 3] and estimates == {step: holds[step] for step in estimates}, (estimates, holds)
    assert all(money > 0 for _, money in estimates.values())

    _put(
        store,
        '@id("pricey") forbid(principal, action == Action::"model", resource) when { context.call.estimated_usd_micros > 0 };',
    )
    task_id, result = _run(store, registry, _submission(turns=2))
    assert result.status is TaskStatus.FAILED and "tenant/pricey" in result.error["message"], result.error
    assert store.steps.load(task_id) == []  # the first call was never made


def test_one_worker_never_applies_a_tenants_rules_to_another_tenants_task_whose_rules_have_the_same_version(
    store: Storage, registry: ToolRegistry
) -> None:
    """A worker compiles each tenant's rules once and keeps them: tenant A's first version of its
    tenant scope and tenant B's are different rules, even in one process (the cache was keyed by
    scope and version only, so B's task was denied by A's rule)."""
    deny = '@id("off") forbid(principal, action == Action::"model", resource);'
    spawns = '@id("no-spawns") forbid(principal, action == Action::"spawn", resource);'
    store.policies.put("a", "tenant", deny, check(deny).digest)
    store.policies.put("b", "tenant", spawns, check(spawns).digest)
    engine = _engine(store, registry)
    sub = _submission(turns=1)
    first, second = (store.tasks.create(sub, tenant=t).task_id for t in ("a", "b"))
    denied = engine.run(first)
    assert denied.status is TaskStatus.FAILED and denied.error is not None, denied
    assert "tenant/off" in denied.error["message"], denied.error
    assert engine.run(second).status is TaskStatus.SUCCEEDED  # B's own rule has nothing to say


def _spent(store: Storage, task_id: str, upto: int | None = None) -> int:
    """What the task's model calls cost, in millionths (its committed call steps up to ``upto``)."""
    return sum(
        micros(r.body.cost_usd)
        for r in store.steps.load(task_id)
        if isinstance(r.body, CallStep) and (upto is None or r.number <= upto)
    )


def test_a_rule_sees_what_the_users_tasks_spent_today_and_a_task_for_no_user_sees_nothing(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``history.user_spend_today_micros`` is what every task of the end user spent today (UTC),
    read from the user's day item, which counts the user's calls while a rule of the tenant reads
    it (the user has no cap here). "No lookups once the user spent more than one task's worth
    today": the user's second task is refused its lookup, another user's is not, and a task for
    no user sees no such attribute (a rule reads it behind ``has``)."""
    _put(store, _spend_rule(10**12, mode="log_only"))  # shadowed first: the user's day is counted from now on
    seen = _seen_requests(monkeypatch)
    first, result = _run(store, registry, _submission(turns=3), user_field="alice")
    assert result.status is TaskStatus.SUCCEEDED, result.error
    before = _spent(store, first)
    assert before > 0

    _put(store, _spend_rule(before - 1))  # enforced: past what the first task spent
    seen.clear()
    second, result = _run(store, registry, _submission(turns=2), user_field="alice")
    assert result.status is TaskStatus.SUCCEEDED, result.error
    (tool_check,) = [r for r in seen if r["action"]["id"] == "tool"]
    today = tool_check["context"]["history"]["user_spend_today_micros"]
    assert today == before + _spent(store, second, upto=1)  # the first task's calls and this one's first
    assert _tool_errors(store, second) == ["denied by policy rule tenant/spent-today"]

    for field in ({"user_field": "bob"}, {}):  # another user (one call spent so far), and no user
        seen.clear()
        other, result = _run(store, registry, _submission(turns=2), **field)
        assert result.status is TaskStatus.SUCCEEDED and _tool_errors(store, other) == [""], field
        history = [r["context"]["history"] for r in seen]
        if field:
            assert all(h["user_spend_today_micros"] < before for h in history)
        else:
            assert all("user_spend_today_micros" not in h for h in history)


def _spend_rule(above: int, mode: str = "enforce") -> str:
    return (
        f'@id("spent-today") @mode("{mode}") @message("no lookups once you spent this much today") '
        'forbid(principal, action == Action::"tool", resource == Tool::"lookup") when { '
        f"context.history has user_spend_today_micros && context.history.user_spend_today_micros > {above} }};"
    )


def _tool_errors(store: Storage, task_id: str) -> list[str]:
    """Each tool call's result as the model read it: "" when it ran, the refusal otherwise."""
    out = []
    for r in store.steps.load(task_id):
        if isinstance(r.body, ToolsStep):
            out += [o.content.split(":")[0] if o.content.startswith("denied") else "" for o in r.body.results]
    return out


@pytest.mark.parametrize("capped", [False, True])
def test_the_users_spend_costs_a_read_of_its_day_item_per_check_only_when_a_rule_reads_it(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, capped: bool
) -> None:
    """A task of 2 model calls and 1 tool call (3 checks). A capped user's calls hold and settle on
    its day item anyway (2 UpdateItem a call); an uncapped user's are counted the same way only
    while a rule of the tenant reads the attribute. The rule's read: 1 GetItem per check."""
    if capped:
        store.caps.put(TENANT, "user", "carol", CapLimits(daily_usd=Decimal(1000)))
    calls = TableCalls(store, monkeypatch)
    day = keys.CAP_USE + "user#carol#"
    _put(
        store,
        '@id("s") forbid(principal, action == Action::"spawn", resource) when { context.history.tree_tokens > 0 };',
    )
    _, result = _run(store, registry, _submission(turns=2), user_field="carol")
    assert result.status is TaskStatus.SUCCEEDED, result.error
    assert calls.of(day) == ({"update": 4} if capped else {})

    _put(store, _spend_rule(10**12))
    calls.seen.clear()
    _, result = _run(store, registry, _submission(turns=2), user_field="carol")
    assert result.status is TaskStatus.SUCCEEDED, result.error
    assert calls.of(day) == {"update": 4, "get": 3}
