"""What a policy rule sees of a call (core.engine._policy, docs/POLICIES.md "What a rule sees"),
and what reading it costs: the real engine on the in-memory twin, with rules stored as
``agentq policy put`` stores them and DynamoDB's calls counted on the twin's table.
The rules over real HTTP and worker processes are tests/test_policies.py."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.core.policies import check
from agentq.core.policies import request as cedar_request
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


def _run(store: Storage, registry: ToolRegistry, sub: TaskSubmission, **create: Any) -> tuple[str, Any]:
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
