"""Priority tiers: the worker's slot pool shares its capacity between high, normal and low by
weight (6:3:1) under contention, never starves low, and gives a lone tier all it asks; a
worker with a high backlog still picks up low tasks long before the backlog is drained."""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from agentq.control.submit import submit
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.resources import TIERS
from agentq.runtime import Settings, build_queues, build_registry, build_store
from agentq.worker import DEFAULT_WEIGHTS, SlotPool, Worker, WorkerConfig
from agentq_dev.moto_server import MotoServer

from tests.helpers import call, deployment, scripted, wait_for

WEIGHTS = {"high": 6, "normal": 3, "low": 1}


def _wait_for(predicate: Callable[[], Any], timeout: float = 10, what: str = "condition") -> Any:
    return wait_for(predicate, timeout, what, interval=0.01)


class _Holders:
    """Threads that each take one slot of ``tier``, hold it until told, give it back, repeat:
    a tier with more demand than the pool can serve. Grants arrive on ``grants`` in order."""

    def __init__(self, pool: SlotPool, per_tier: dict[str, int]) -> None:
        self.pool = pool
        self.grants: queue.Queue[tuple[str, threading.Event]] = queue.Queue()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._hold, args=(tier,), daemon=True)
            for tier, n in per_tier.items()
            for _ in range(n)
        ]

    def start(self) -> _Holders:
        for t in self.threads:
            t.start()
        return self

    def _hold(self, tier: str) -> None:
        while not self.stop.is_set():
            got = self.pool.acquire(tier, 1, timeout=30)
            if not got:
                continue
            done = threading.Event()
            self.grants.put((tier, done))
            if not self.stop.is_set():
                done.wait()
            self.pool.release(tier, got)

    def close(self, held: deque[tuple[str, threading.Event]]) -> None:
        self.stop.set()
        for _, done in held:
            done.set()
        while not self.grants.empty():
            self.grants.get()[1].set()
        for t in self.threads:
            t.join(timeout=5)

    def next_grant(self) -> tuple[str, threading.Event]:
        return self.grants.get(timeout=5)


def _churn(holders: _Holders, held: deque[tuple[str, threading.Event]], rounds: int) -> list[str]:
    """Free the longest-held slot, see which tier the pool gives it to; ``rounds`` times."""
    given = []
    for _ in range(rounds):
        held.popleft()[1].set()
        grant = holders.next_grant()
        held.append(grant)
        given.append(grant[0])
    return given


# ------------------------------------------------------------------- SlotPool


def test_the_default_weights_are_six_three_one() -> None:
    assert DEFAULT_WEIGHTS == WEIGHTS


def test_under_contention_freed_slots_converge_to_the_tier_weights() -> None:
    pool = SlotPool(10, WEIGHTS)
    holders = _Holders(pool, dict.fromkeys(TIERS, 12)).start()  # every tier wants > capacity
    held: deque[tuple[str, threading.Event]] = deque(holders.next_grant() for _ in range(10))
    try:
        _wait_for(lambda: all(pool.waiting[t] > 0 for t in TIERS), what="all tiers waiting")
        given = _churn(holders, held, 60)
        assert Counter(t for t, _ in held) == Counter(WEIGHTS)  # 6 high, 3 normal, 1 low in use
        assert Counter(given[-30:]) == Counter({t: 3 * w for t, w in WEIGHTS.items()})
        assert pool.busy == 10
    finally:
        holders.close(held)


def test_low_is_never_starved_by_a_flood_of_high() -> None:
    pool = SlotPool(10, WEIGHTS)
    flood = _Holders(pool, {"high": 30}).start()
    held: deque[tuple[str, threading.Event]] = deque(flood.next_grant() for _ in range(10))
    low = _Holders(pool, {"low": 3})
    low.grants = flood.grants  # one stream of grants, in order
    low.start()
    try:
        _wait_for(lambda: pool.waiting["low"] == 3 and pool.waiting["high"] > 0, what="low waiting behind high")
        given = _churn(flood, held, 70)
        assert given[0] == "low"  # the first slot high frees goes to the waiting low tier
        for i in range(0, 70, 10):
            assert "low" in given[i : i + 10], f"low got nothing in grants {i}..{i + 9}: {given}"
        assert 0 < given.count("low") < given.count("high")
    finally:
        low.stop.set()
        flood.close(held)
        low.close(deque())


def test_with_no_contention_a_tier_gets_what_it_asks() -> None:
    pool = SlotPool(10, WEIGHTS)
    for tier in TIERS:  # alone, even low may use the whole pool
        assert pool.acquire(tier, 10, timeout=0.1) == 10
        pool.release(tier, 10)
    assert pool.acquire("low", 4, timeout=0.1) == 4
    assert pool.acquire("normal", 2, timeout=0.1) == 2
    assert pool.acquire("high", 10, timeout=0.1) == 4  # what is free
    started = time.monotonic()
    assert pool.acquire("high", 1, timeout=0.2) == 0  # full: nothing, after the timeout
    assert time.monotonic() - started >= 0.19
    pool.release("low", 4)
    pool.release("normal", 2)
    pool.release("high", 4)
    assert pool.busy == 0


def test_when_every_tier_asks_for_the_whole_pool_at_once_each_gets_a_share() -> None:
    """What the worker's three pollers do: each asks for up to 10 slots. Freed capacity must
    not all go to one tier while the others wait (the high poller would otherwise hold every
    slot through an empty long poll, again and again)."""
    pool = SlotPool(10, WEIGHTS)
    assert pool.acquire("normal", 10, timeout=0.1) == 10  # a full pool
    got: dict[str, int] = {}

    def ask(tier: str) -> None:
        got[tier] = pool.acquire(tier, 10, timeout=2)

    askers = [threading.Thread(target=ask, args=(tier,)) for tier in TIERS]
    for t in askers:
        t.start()
    _wait_for(lambda: all(pool.waiting[t] == 1 for t in TIERS), what="three pollers waiting")
    pool.release("normal", 10)
    for t in askers:
        t.join(timeout=5)
    assert all(got[tier] > 0 for tier in TIERS), got
    assert got["high"] >= got["normal"] >= got["low"] and sum(got.values()) <= 10, got


# -------------------------------------------------------------------- worker


def _deployment(moto_server: MotoServer) -> Settings:
    return deployment(moto_server, visibility_timeout=10)  # type: ignore[no-any-return]


def _task(priority: str, turns: int = 2, latency: float = 0.2) -> TaskSubmission:
    script = [
        {"text": f"turn {i}", "latency_seconds": latency, "tool_calls": [call("lookup", query=str(i))]}
        for i in range(turns - 1)
    ]
    script.append({"text": "done", "latency_seconds": latency})
    return scripted(script, tools=["lookup"]).model_copy(update={"priority": priority})


def _small_worker(settings: Settings) -> Worker:
    return Worker(settings, WorkerConfig(concurrency=3, lease_seconds=3, heartbeat_seconds=1, visibility_seconds=10))


def test_low_tasks_submitted_behind_a_high_backlog_are_done_long_before_it_drains(moto_server: MotoServer) -> None:
    settings = _deployment(moto_server)
    store, queues, registry = build_store(settings), build_queues(settings), build_registry(settings)
    high = [submit(store, registry, _task("high"), tenant="t", queues=queues).task_id for _ in range(30)]
    low = [submit(store, registry, _task("low"), tenant="t", queues=queues).task_id for _ in range(3)]

    worker = _small_worker(settings).start()
    try:
        _wait_for(lambda: all(store.tasks.get(t).status.terminal for t in low), timeout=30, what="the low tasks done")
        backlog = [t for t in high if not store.tasks.get(t).claim_count]  # never picked up yet
    finally:
        worker.shutdown()

    lows = [store.tasks.get(t) for t in low]
    assert all(task.status is TaskStatus.SUCCEEDED for task in lows)
    assert len(backlog) >= 10, f"only {len(backlog)} of 30 high tasks were still queued when the low ones were done"


def test_a_lone_busy_tier_is_not_held_back_by_the_idle_tiers(moto_server: MotoServer) -> None:
    """Only low has work: the high and normal pollers find nothing and must not keep the
    worker's slots to themselves."""
    settings = _deployment(moto_server)
    store, queues, registry = build_store(settings), build_queues(settings), build_registry(settings)
    # 2 s of scripted latency each: long enough that tasks admitted together overlap however slow the machine
    low = [submit(store, registry, _task("low", latency=1.0), tenant="t", queues=queues).task_id for _ in range(3)]

    worker = _small_worker(settings).start()
    try:
        _wait_for(lambda: all(store.tasks.get(t).status.terminal for t in low), timeout=30, what="the low tasks done")
    finally:
        worker.shutdown()
    tasks = [store.tasks.get(t) for t in low]
    assert all(task.status is TaskStatus.SUCCEEDED for task in tasks)
    # low's share under contention would be 1 of the 3 slots; alone, it gets all 3 at once:
    # every task was claimed before any finished (the idle tiers' pollers held no slot).
    assert all(task.claim_count == 1 for task in tasks)
    assert max(float(task.first_claimed_at or 0) for task in tasks) < min(
        float(task.finished_at or 0) for task in tasks
    )
