"""Invariant 4 at every scope under contention (``storage.scope_caps``): real processes racing
for one user's, agent's and key's windows at once, against moto server; and a tree of sub-agents
of one user run by the local stack's worker processes, its calls racing for the user's cap."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.caps import CapLimits
from agentq.core.models import LLMStep, Task, TaskStatus
from agentq.runtime import Settings, build_registry
from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests import racers
from tests.helpers import call, scripted

PROCESSES = 20
AMOUNT = 700
MICROS = 3_000
ATTEMPTS = 4
CAP = 20_000  # demand is 20 * 4 * 700 = 56,000 tokens, almost three times the cap


@pytest.mark.parametrize(
    ("tight", "fits"),
    [
        ({"hourly_tokens": CAP}, CAP // AMOUNT),
        ({"daily_tokens": CAP}, CAP // AMOUNT),
        ({"hourly_usd": Decimal("0.09")}, 90_000 // MICROS),
        ({"daily_usd": Decimal("0.09"), "soft_daily_usd": Decimal("0.09")}, 90_000 // MICROS),
    ],
)
def test_twenty_processes_holding_at_once_never_push_any_scope_past_its_cap(
    settings: Settings, store: Storage, tight: dict[str, Any], fits: int
) -> None:
    generous = CapLimits(hourly_tokens=10**9, daily_usd=Decimal(1000))
    store.caps.put("t", "user", "u", generous)
    store.caps.put("t", "agent", "a", generous)
    store.caps.put("t", "key", "k", CapLimits.model_validate(tight))  # the last held: refusals give the others back
    argv = ["t", str(AMOUNT), str(ATTEMPTS), str(MICROS)]
    reports = racers.race(settings, "tests.caps_racer", [argv] * PROCESSES)

    granted = sum(r["granted"] for r in reports)
    assert granted == fits  # never past the cap, and no lost update: exactly as many grants as fit
    assert sum(1 for r in reports if r["granted"] < ATTEMPTS) > 0  # there really was contention
    used, used_micros = sum(r["used"] for r in reports), sum(r["used_micros"] for r in reports)
    for scope, name in (("user", "u"), ("agent", "a"), ("key", "k")):
        usage = store.caps.usage("t", scope, name)  # type: ignore[arg-type]
        for window in ("hour", "day"):  # settled exactly, refused holds given back on every scope
            assert usage[f"{window}_tokens"] == usage[f"{window}_used_tokens"] == used
            assert usage[f"{window}_usd"] == usage[f"{window}_used_usd"] == used_micros


@pytest.fixture(scope="module")
def stack() -> Any:
    with LocalStack(prefix="cap", workers=2, api=False) as s:
        yield s


def _wait(store: Storage, task_id: str, pred: Any, timeout: float = 180, on_end: Any = str) -> Task:
    deadline = time.monotonic() + timeout
    while not pred(task := store.tasks.get(task_id)):
        assert time.monotonic() < deadline, f"task still {task.status.value}: {on_end(task)}"
        time.sleep(0.1)
    return task


def test_sub_agents_of_one_user_on_two_worker_processes_never_push_the_users_cap_past_it(stack: LocalStack) -> None:
    """Twenty sub-agents of one user's tree, run at once by two worker processes, each trying
    to spend far past the user's hourly cap: the window never passes it and counts exactly the
    calls that were made (every call of the tree, committed or orphaned)."""
    assert stack.settings is not None
    store = stack.store()
    cap = 40_000
    store.caps.put("t", "user", "racer", CapLimits(hourly_tokens=cap))
    hungry = {
        "turns": [{"text": f"step {i}", "tool_calls": [call("note_write", key="k", value="v")]} for i in range(12)]
    }
    subagents = [{"goal": f"hungry {i}", "token_share": 3_000, "tools": ["note_write"], "script": hungry}
                 for i in range(20)]  # fmt: skip
    turns = [{"text": "", "tool_calls": [call("spawn_subagents", subagents=subagents, max_concurrency=20)]},
             {"text": "tallied"}]  # fmt: skip
    sub = scripted(turns, tools=["spawn_subagents", "note_write"], max_tokens=200_000, max_output_tokens=8_000)
    sub = sub.model_copy(update={"user": "racer"})
    sub.constraints.max_fanout = 20
    root = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
    # Children defer at the cap (a delayed message up to the hour's end): wait until none runs.
    children: list[Task] = []

    def settled(task: Task) -> bool:
        nonlocal children
        if task.status is not TaskStatus.WAITING and not task.status.terminal and not _deferred_at_cap(task):
            return False
        ids = [c for s in store.spawns.list(root.task_id) for c in s.children]
        children = [store.tasks.get(c) for c in ids]  # with their latest retry
        return len(children) == 20 and all(c.status.terminal or _deferred_at_cap(c) for c in children)

    _wait(store, root.task_id, settled, on_end=lambda t: f"{t.error}")
    tree = [store.tasks.get(root.task_id), *children]
    assert not any(t.status is TaskStatus.FAILED for t in tree), [t.error for t in tree]
    calls = sum(s.body.usage.total for t in tree for s in store.steps.load(t.task_id) if isinstance(s.body, LLMStep))
    orphans = sum(o.call.usage.total for t in tree for o in store.steps.orphans(t.task_id))
    usage = store.caps.usage("t", "user", "racer")
    assert usage["hour_tokens"] == usage["hour_used_tokens"] == calls + orphans <= cap
    assert sum(1 for c in children if _deferred_at_cap(c)) > 0  # the cap, not the shares, stopped them


def _deferred_at_cap(task: Task) -> bool:
    """Waiting for the user's window to roll over, holding nothing."""
    retry = task.retry
    return (
        retry is not None
        and retry.code == "cap_reached"
        and task.lease_expires < time.time()
        and task.inflight is None
    )
