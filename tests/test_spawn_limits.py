"""The spawn's limits refuse exactly at their bounds (``core.fanout.plan_children``), with a
message the model reads as the tool's error, and every child it plans is a valid task: a
share is a task's own budget, so it never passes a task's caps, however large the parent's."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest

from agentq.core.fanout import MIN_CHILD_SHARE, SpawnInput, SpawnRejected, parse_spawn_input, plan_children
from agentq.core.models import MAX_COST_USD, MAX_TOKENS, Task, TaskStatus
from agentq.core.pricing import micros

from tests.helpers import scripted


def _task(depth: int = 0, *, max_depth: int = 3, max_fanout: int = 10, max_cost_usd: str | None = None) -> Task:
    sub = scripted([{"text": "x"}], tools=["spawn_subagents"], max_depth=max_depth, max_fanout=max_fanout)
    if max_cost_usd is not None:
        sub.constraints.max_cost_usd = Decimal(max_cost_usd)
    now = time.time()
    return Task(task_id="p" * 32, tenant="t", status=TaskStatus.RUNNING, submission=sub, depth=depth,
                root_id="p" * 32, created_at=now, updated_at=now, started_at=now)  # fmt: skip


def _spec(n: int, **each: Any) -> SpawnInput:
    subagents = [{"goal": f"g{i}", "script": {"turns": [{"text": "x"}]}, **each} for i in range(n)]
    return parse_spawn_input({"subagents": subagents})


@pytest.mark.parametrize("max_depth", [1, 2, 3, 10])
def test_depth_is_refused_exactly_past_max_depth(max_depth: int) -> None:
    ok = plan_children(_task(max_depth - 1, max_depth=max_depth), "toolu_1", _spec(1), 10_000)
    assert ok[0].submission.constraints.max_depth == max_depth
    with pytest.raises(SpawnRejected, match=f"max_depth is {max_depth}"):
        plan_children(_task(max_depth, max_depth=max_depth), "toolu_1", _spec(1), 10_000)


@pytest.mark.parametrize("max_fanout", [1, 10, 100])
def test_breadth_is_refused_exactly_past_max_fanout(max_fanout: int) -> None:
    planned = plan_children(_task(max_fanout=max_fanout), "t1", _spec(max_fanout), MIN_CHILD_SHARE * max_fanout)
    assert len(planned) == max_fanout
    if max_fanout < 100:  # the spawn input itself caps nothing; max_fanout does
        with pytest.raises(SpawnRejected, match=f"max_fanout is {max_fanout}"):
            plan_children(_task(max_fanout=max_fanout), "t1", _spec(max_fanout + 1), 10**6)


def test_a_share_below_the_minimum_is_refused_exactly() -> None:
    assert plan_children(_task(), "t1", _spec(2), 2 * MIN_CHILD_SHARE)[0].share == MIN_CHILD_SHARE
    with pytest.raises(SpawnRejected, match="minimum"):
        plan_children(_task(), "t1", _spec(2), 2 * MIN_CHILD_SHARE - 1)


def test_a_root_raised_past_a_tasks_token_cap_gives_each_child_at_most_that_and_keeps_the_rest() -> None:
    """A root's own ``max_tokens`` is at most 1e9, but a raise adds to its budget without bound:
    the even split of 1e9 + 1 tokens was one child of 1e9 + 1, which its own Constraints refused
    with a pydantic ValidationError, no ``SpawnRejected``: the spawn turn failed for good
    (a deterministic fault) where the model should have got its children."""
    available = 3 * MAX_TOKENS + 7
    plans = plan_children(_task(), "t1", _spec(2), available)
    assert [p.share for p in plans] == [MAX_TOKENS, MAX_TOKENS]  # the rest stays with the parent
    assert [p.submission.constraints.max_tokens for p in plans] == [MAX_TOKENS, MAX_TOKENS]
    one = plan_children(_task(), "t1", _spec(1), MAX_TOKENS + 1)
    assert one[0].share == MAX_TOKENS


def test_a_share_asked_past_a_tasks_token_cap_is_refused_naming_the_field_and_the_bound() -> None:
    with pytest.raises(SpawnRejected, match=rf"subagents\[0\]\.token_share is {MAX_TOKENS + 1}.* at most {MAX_TOKENS}"):
        plan_children(_task(), "t1", _spec(1, token_share=MAX_TOKENS + 1), 3 * MAX_TOKENS)
    assert plan_children(_task(), "t1", _spec(1, token_share=MAX_TOKENS), 3 * MAX_TOKENS)[0].share == MAX_TOKENS


def test_a_root_raised_past_a_tasks_money_cap_gives_each_child_at_most_that() -> None:
    """The same for dollars: ``max_cost_usd`` is at most $1,000,000 a task, and a raise adds
    without bound; a child's part of what is left is cut to it, the rest staying with the parent."""
    left = micros(MAX_COST_USD) * 3
    plans = plan_children(_task(max_cost_usd="1000"), "t1", _spec(1), 10_000, available_micros=left)
    assert plans[0].submission.constraints.max_cost_usd == MAX_COST_USD
    assert plans[0].share_micros == micros(MAX_COST_USD)


class _Fanout:
    """Step Functions' part of a spawn: the execution's start (the children are not run here)."""

    def start(self, *, parent: Any, spawn_id: str, children: list[Any], max_concurrency: int) -> str:
        return "arn:aws:states:local:000000000000:execution:fanout:1"

    def child_finished(self, task_token: str, task_id: str, status: TaskStatus) -> None:
        return None


def test_a_root_raised_past_a_tasks_token_cap_spawns_and_parks_where_its_spawn_turn_failed() -> None:
    """The whole spawn turn, on the engine: a root of 1e9 tokens raised by 10,000 spawns its
    child (1e9 tokens, the rest kept) and parks ``waiting``; it failed for good, the child's
    Constraints refused as a deterministic fault."""
    from agentq.core.engine import Engine, EngineConfig
    from agentq.core.fanout import spawn_tool_spec
    from agentq.core.tools import ToolRegistry
    from agentq.storage.container import memory_storage

    from tests.helpers import call

    store = memory_storage()
    turns = [{"text": "", "tool_calls": [call("spawn_subagents", subagents=[{"goal": "all of it",
                                                                              "script": {"turns": [{"text": "c"}]}}])]},
             {"text": "done"}]  # fmt: skip
    root = store.tasks.create(scripted(turns, tools=["spawn_subagents"], max_tokens=MAX_TOKENS), tenant="t")
    store.budgets.raise_cap(root.task_id, 10_000)
    engine = Engine(store, worker_id="w", tools=ToolRegistry([spawn_tool_spec()]), fanout=_Fanout(),
                    config=EngineConfig(lease_seconds=30))  # fmt: skip
    result = engine.run(root.task_id)
    assert result.status is TaskStatus.WAITING, store.tasks.get(root.task_id).error
    (child_id,) = store.spawns.list(root.task_id)[0].children
    assert store.budgets.get(child_id).cap == MAX_TOKENS
    left = store.budgets.get(root.task_id)
    assert left.available == MAX_TOKENS + 10_000 - left.used - MAX_TOKENS > 0  # the rest stays with the root
