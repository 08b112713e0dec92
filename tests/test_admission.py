"""Admission control: a worker holds no more tasks than its heartbeat can keep leased, and what
it does not take stays in SQS for another worker.

The limit is ``beat_threads / write latency x (lease - heartbeat) x safety`` (the latency of the
hub's own writes: liveness renewals, lease extensions), between a floor and the concurrency; it falls at once and rises at most twofold per heartbeat."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from agentq.control.submit import submit
from agentq.core.models import TaskStatus
from agentq.runtime import build_queues, build_registry, build_store
from agentq.worker import Admission, LeaseWriteRate, SlotPool, Worker, WorkerConfig
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, scripted, wait_for

# lease 3 s, heartbeat 1 s, safety 0.5: a round may take 1 s; 16 threads
CONFIG = WorkerConfig(
    concurrency=256, lease_seconds=3, heartbeat_seconds=1, beat_threads=16, admission_safety=0.5, admission_floor=8
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _admission(latency: float | None, config: WorkerConfig = CONFIG) -> tuple[Admission, LeaseWriteRate, Clock]:
    rate = LeaseWriteRate(config.beat_threads, alpha=1.0)  # alpha 1: the last sample is the estimate
    if latency is not None:
        rate.observe(latency)
    clock = Clock()
    return Admission(config, rate, clock=clock), rate, clock


def _settle(
    admission: Admission, clock: Clock, busy: Callable[[int], int] = lambda limit: limit, seconds: int = 10
) -> int:
    """The limit after ``seconds`` of a backlog that fills whatever it is given."""
    limit = admission.limit(0)
    for _ in range(seconds * 4):
        clock.now += 0.25
        limit = admission.limit(busy(limit))
    return limit


def test_a_worker_starts_at_the_floor_until_a_lease_write_is_timed() -> None:
    admission, _, _ = _admission(latency=None)
    assert admission.limit(0) == 8


def test_held_tasks_are_capped_at_what_the_hub_can_extend_within_the_lease() -> None:
    admission, _, clock = _admission(latency=0.5)  # 16 / 0.5 s = 32 writes/s, x 1 s
    assert _settle(admission, clock) == 32


def test_held_tasks_that_need_few_writes_each_are_capped_that_much_later() -> None:
    """With worker liveness a held task needs a write only now and then (its backstop lease,
    live text): the same slow store holds as many more tasks as each needs fewer writes."""
    admission, _, clock = _admission(latency=0.5)
    admission.demand = lambda: 0.125  # one write per task every 8 heartbeats
    assert _settle(admission, clock) == 256  # 32 x 8, then capped by the concurrency
    admission.demand = lambda: 0.25
    assert _settle(admission, clock) == 128


def test_a_fast_store_caps_nothing_below_the_concurrency() -> None:
    admission, _, clock = _admission(latency=0.005)  # 3,200 writes/s
    assert _settle(admission, clock) == 256


def test_a_store_slower_than_the_floor_allows_still_gets_the_floor() -> None:
    admission, _, clock = _admission(latency=30)
    assert _settle(admission, clock) == 8


def test_the_limit_falls_at_once_when_lease_writes_slow_down() -> None:
    admission, rate, clock = _admission(latency=0.01)
    assert _settle(admission, clock) == 256
    rate.observe(1.0)  # 16 writes/s
    assert admission.limit(256) == 16


def test_the_limit_rises_at_most_twofold_per_heartbeat_and_to_twice_what_is_held() -> None:
    admission, rate, clock = _admission(latency=2.0)  # 8 writes/s: the floor
    assert _settle(admission, clock) == 8
    rate.observe(0.01)  # the store is fast again: the target is 256
    seen: list[int] = []
    for _ in range(6):
        clock.now += 1.0
        seen.append(admission.limit(seen[-1] if seen else 8))
    assert seen == [16, 32, 64, 128, 256, 256]
    # after an idle spell one fast claim does not open the gates: twice what is held, at most
    clock.now += 600
    rate.observe(0.01)
    assert admission.limit(3) == 8  # the floor, not 256
    clock.now += 1.0
    assert admission.limit(8) == 16  # and from there, doubling again


def test_the_slot_pool_grants_no_more_than_the_admission_limit() -> None:
    limit = {"value": 5}
    pool = SlotPool(100, {"high": 6, "normal": 3, "low": 1}, limit=lambda busy: limit["value"])
    assert pool.acquire("normal", 10, timeout=0.1) == 5
    assert pool.acquire("normal", 10, timeout=0.1) == 0  # held back, though 95 of 100 are free
    limit["value"] = 12
    assert pool.acquire("normal", 10, timeout=0.1) == 7
    limit["value"] = 2  # it drops: what was granted stays granted, nothing new
    pool.release("normal", 10)
    assert pool.busy == 2 and pool.acquire("normal", 1, timeout=0.1) == 0


# ------------------------------------------------------------- two workers, moto


def _slowed(fn: Callable[..., Any], delay: float) -> Callable[..., Any]:
    @functools.wraps(fn)
    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(delay)
        return fn(*args, **kwargs)

    return slow


def test_a_worker_whose_lease_writes_are_slow_holds_few_tasks_and_leaves_the_rest_to_another(
    moto_server: MotoServer,
) -> None:
    """Worker A's writes (its liveness renewals, lease extensions, commits) take 0.5 s: with 2
    beat threads that is 4 writes/s, x 1 s = a limit of 4 of its 32 slots while each held task
    needs a lease write every heartbeat (a 2 s task lease, renewed when half is left). Its
    backlog stays in SQS, and worker B, whose writes are fast, takes it."""
    settings = deployment(moto_server, visibility_timeout=10)
    store, queues, registry = build_store(settings), build_queues(settings), build_registry(settings)
    job = scripted([{"text": "done", "latency_seconds": 2.0}])  # held ~2 s: needs heartbeats
    ids = [submit(store, registry, job, tenant="t", queues=queues).task_id for _ in range(30)]
    config = WorkerConfig(
        concurrency=32, lease_seconds=3, heartbeat_seconds=1, visibility_seconds=6, beat_threads=2, admission_floor=2,
        task_lease_seconds=2,
    )  # fmt: skip

    slow = Worker(settings, config)
    slow_table = slow.store.tasks.table  # every repository of A's store writes through it
    slow_table.update = _slowed(slow_table.update, 0.5)  # type: ignore[method-assign]
    slow_table.put = _slowed(slow_table.put, 0.5)  # type: ignore[method-assign]
    admitted_max = [0]
    stop_watch = threading.Event()

    def watch() -> None:
        while not stop_watch.is_set():
            admitted_max[0] = max(admitted_max[0], slow.slots.busy)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    fast = Worker(settings, config)
    slow.start()
    watcher.start()
    try:
        time.sleep(5)  # A alone, long enough to measure its writes and settle
        alone = slow.stats()
        visible = int(
            queues.sqs.get_queue_attributes(
                QueueUrl=queues.url("normal"), AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]["ApproximateNumberOfMessages"]
        )
        fast.start()
        wait_for(lambda: all(store.tasks.get(t).status.terminal for t in ids), timeout=45, what="every task done")
    finally:
        stop_watch.set()
        slow.shutdown()
        fast.shutdown()

    assert alone["lease_write_latency_s"] >= 0.5 and alone["admission_limit"] <= 4, alone
    # the limit, plus one probe per idle tier (high, low) polling outside the pool's contest
    assert admitted_max[0] <= (alone["admission_limit_max"] or 0) + 2, (admitted_max[0], alone)
    assert visible >= 30 - slow.processed - admitted_max[0] - 2, f"only {visible} messages left in SQS"
    assert visible >= 15
    assert all(store.tasks.get(t).status is TaskStatus.SUCCEEDED for t in ids)
    assert fast.processed >= 15 and fast.processed > slow.processed, (fast.processed, slow.processed)
    assert fast.stats()["held_max"] > alone["admission_limit"]  # the same config, fast writes: more held
