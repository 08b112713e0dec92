"""Invariant 4 at every scope under contention (``storage.scope_caps``): real processes racing
for one user's, agent's and key's windows at once, against moto server; and a tree of sub-agents
of one user run by the local stack's worker processes, its calls racing for the user's cap."""

from __future__ import annotations

import collections
import time
from decimal import Decimal
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.caps import CapLimits, day_key, hour_of_day
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
    started = time.time()  # every racer holds at this time: one window, whenever the race ends
    argv = ["t", str(AMOUNT), str(ATTEMPTS), str(MICROS), repr(started)]
    reports = racers.race(settings, "tests.caps_racer", [argv] * PROCESSES)

    granted = sum(r["granted"] for r in reports)
    assert granted == fits  # never past the cap, and no lost update: exactly as many grants as fit
    assert sum(1 for r in reports if r["granted"] < ATTEMPTS) > 0  # there really was contention
    used, used_micros = sum(r["used"] for r in reports), sum(r["used_micros"] for r in reports)
    for scope, name in (("user", "u"), ("agent", "a"), ("key", "k")):
        usage = usage_since(store, "t", scope, name, started)
        for window in ("hour", "day"):  # settled exactly, refused holds given back on every scope
            assert usage[f"{window}_tokens"] == usage[f"{window}_used_tokens"] == used
            assert usage[f"{window}_usd"] == usage[f"{window}_used_usd"] == used_micros


def usage_since(store: Storage, tenant: str, scope: str, name: str, started: float) -> dict[str, int]:
    """A scope's counters summed over every hour and day since ``started`` (a run that straddles
    a clock hour, or midnight, holds its later calls in the next window)."""
    total = collections.Counter[str]()
    for window in ("hour", "day"):
        for usage in usage_by_window(store, tenant, scope, name, started, window):
            total.update({k: v for k, v in usage.items() if k.startswith(window)})
    return dict(total)


def usage_by_window(
    store: Storage, tenant: str, scope: str, name: str, started: float, window: str
) -> list[dict[str, int]]:
    """A scope's counters in each clock hour (``window="hour"``) or day since ``started``."""
    now = time.time()
    times = [started, *range(int(started) // 3600 * 3600 + 3600, int(now) + 1, 3600), now]
    at = {day_key(t) + (hour_of_day(t) if window == "hour" else ""): t for t in times}
    return [store.caps.usage(tenant, scope, name, now=t) for t in at.values()]  # type: ignore[arg-type]


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
    started = time.time()
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
    usage = usage_since(store, "t", "user", "racer", started)
    assert usage["hour_tokens"] == usage["hour_used_tokens"] == calls + orphans
    # Each clock hour's window within the cap: a run across the end of an hour rightly spends
    # the next hour's too (the children deferred at the cap wake at its start).
    hours = usage_by_window(store, "t", "user", "racer", started, "hour")
    assert all(h.get("hour_tokens", 0) <= cap for h in hours), hours
    # The cap, not the shares, stopped them; unless the hour turned meanwhile: the next hour's
    # window has room for every share (20 x 3,000 < 2 x 40,000), and each hour's is checked above.
    assert len(hours) > 1 or sum(1 for c in children if _deferred_at_cap(c)) > 0


def _deferred_at_cap(task: Task) -> bool:
    """Waiting for the user's window to roll over, holding nothing."""
    retry = task.retry
    return (
        retry is not None and retry.code == "cap_reached" and task.lease_expires < time.time() and task.inflight is None
    )


def test_a_zombies_late_answer_is_counted_on_its_users_window_once(settings: Settings, store: Storage) -> None:
    """A worker paused mid call past its lease, a successor that takes the task over and makes
    its own call, then the zombie woken with its answer: its lease is lost, its answer is kept
    as an orphan, and the user's windows count both calls exactly (the zombie settles its own
    hold to its answer's usage; nothing is left held, nothing counted twice)."""
    import dataclasses
    import json
    import os
    import signal
    import subprocess

    from agentq.core.models import TaskSubmission

    from tests.conftest import child_env
    from tests.fake_messages_api import FakeMessagesAPI, StopBeforeAnswer, anthropic_env, message_reply, usage_dict
    from tests.helpers import agentq_process

    def spawn(task_id: str, env: dict[str, str], wait: float, lease: float = 1) -> subprocess.Popen[str]:
        return agentq_process(["run-task", task_id, "--lease", str(lease), "--wait", str(wait)],
                              env=child_env(settings, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip

    store.caps.put("t", "user", "zed", CapLimits(daily_tokens=20_000, hourly_usd=Decimal(10)))
    answer = {"input_tokens": 20, "output_tokens": 900}
    stop_a = StopBeforeAnswer()
    with FakeMessagesAPI(within_max_tokens=True) as fake:
        fake.enqueue(
            dataclasses.replace(message_reply([{"type": "text", "text": "A"}], usage=usage_dict(**answer)),
                                before_send=stop_a),
            message_reply([{"type": "text", "text": "B"}], usage=usage_dict(**answer)),
        )  # fmt: skip
        sub = {"goal": "one turn", "provider": "anthropic", "user": "zed",
               "constraints": {"max_tokens": 5_000, "max_output_tokens": 1_000, "tools": []}}  # fmt: skip
        task = store.tasks.create(TaskSubmission.model_validate(sub), tenant="t")
        started = time.time()
        env = {**anthropic_env(fake), "AGENTQ_MAX_CALL_SECONDS": "8"}
        zombie = spawn(task.task_id, env, wait=0)
        stop_a.caller(zombie.pid)
        try:
            assert stop_a.stopped.wait(30)  # A's call on the wire, A stopped before its answer
            successor = spawn(task.task_id, env, wait=60, lease=10)
            _wait(store, task.task_id, lambda t: t.lease_epoch >= 2, timeout=30)
        finally:
            os.kill(zombie.pid, signal.SIGCONT)
        z_out, z_err = zombie.communicate(timeout=60)
        _, s_err = successor.communicate(timeout=90)
        delivered = sum(u["input_tokens"] + u["output_tokens"] for u in fake.delivered_usage)

    assert json.loads(z_out.strip().splitlines()[-1])["outcome"] == "lease_lost", z_err[-2000:]
    assert store.tasks.get(task.task_id).status.terminal, s_err[-2000:]
    assert len(fake.delivered_usage) == 2 and len(store.steps.orphans(task.task_id)) == 1
    usage = usage_since(store, "t", "user", "zed", started)
    assert usage["day_tokens"] == usage["day_used_tokens"] == delivered == store.budgets.get(task.task_id).used
    assert usage["hour_usd"] == usage["hour_used_usd"] == store.budgets.get(task.task_id).used_micros > 0
