"""The long-running worker (what Fargate runs, and what runs locally): long-polls the tier
queues and runs many tasks at once in one process.

Agents spend their time waiting on LLMs and tools, so a task is a thread and a process holds
hundreds of them. Three pieces keep that cheap and fair:

- ``SlotPool``: the concurrency limit, shared by one poller per tier with weighted fair
  shares (high 6 : normal 3 : low 1 by default). Under contention a freed slot goes to the
  tier furthest below its share, so high goes first and low is never starved.
- ``HeartbeatHub``: one thread extends every held lease and message visibility (batched 10
  per SQS call), instead of a heartbeat thread per task.
- graceful SIGTERM: polling stops, running tasks end at their next step boundary (the step in
  flight is committed), leases are released and each task gets a continuation message.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from agentq import observe
from agentq.dispatch import Action, Dispatcher
from agentq.engine import Engine, RunResult, Session
from agentq.errors import LeaseLost
from agentq.queue import TaskQueues
from agentq.resources import TIERS, QueueSettings
from agentq.runtime import Settings, build_fanout, build_queues, build_registry, build_store, engine_config

log = logging.getLogger("agentq.worker")

DEFAULT_WEIGHTS = {"high": 6, "normal": 3, "low": 1}


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    concurrency: int = 256
    # A dead worker's task is resumed once its message is visible again: within
    # ``visibility_seconds`` of its last heartbeat. The lease lapses a second earlier, so the
    # next receiver can claim at once. Cost: one lease write per task per heartbeat.
    lease_seconds: float = 3.0
    heartbeat_seconds: float = 1.0
    visibility_seconds: int = 4
    poll_wait_seconds: int = 1
    max_receive_count: int = QueueSettings().max_receive_count
    weights: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    drain_seconds: float = 60.0  # how long SIGTERM waits for steps in flight


class SlotPool:
    """A counting semaphore with weighted fair shares between tiers."""

    def __init__(self, capacity: int, weights: dict[str, int]) -> None:
        self.capacity = capacity
        self.weights = weights
        self.in_use = {tier: 0 for tier in weights}
        self.waiting = {tier: 0 for tier in weights}
        self._cond = threading.Condition()

    @property
    def busy(self) -> int:
        return sum(self.in_use.values())

    def acquire(self, tier: str, want: int, timeout: float) -> int:
        """Up to ``want`` slots for ``tier`` (at least one), or 0 after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self.waiting[tier] += 1
            try:
                while True:
                    free = self.capacity - self.busy
                    if free > 0 and self._next_tier() == tier:
                        granted = min(want, free, self._room(tier))
                        self.in_use[tier] += granted
                        return granted
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._cond.wait(left):
                        return 0
            finally:
                self.waiting[tier] -= 1
                self._cond.notify_all()

    def probe(self, tier: str) -> None:
        """One slot for an idle tier's long poll, outside the contest for the pool: a tier
        whose queue was empty must not keep a busy tier from its last free slots. At most one
        probe per tier, so the pool can run ``capacity + len(tiers)`` tasks at the most."""
        with self._cond:
            self.in_use[tier] += 1

    def _next_tier(self) -> str:
        """Among waiting tiers, the one using least of its share (ties: higher priority)."""
        candidates = [t for t in self.weights if self.waiting[t] > 0]
        return min(candidates, key=lambda t: (self.in_use[t] / self.weights[t], list(self.weights).index(t)))

    def _room(self, tier: str) -> int:
        contenders = [t for t in self.weights if t == tier or self.waiting[t] > 0 or self.in_use[t] > 0]
        total = sum(self.weights[t] for t in contenders)
        share = max(1, self.capacity * self.weights[tier] // total)
        return max(1, share - self.in_use[tier])

    def release(self, tier: str, count: int = 1) -> None:
        if count <= 0:
            return
        with self._cond:
            self.in_use[tier] -= count
            self._cond.notify_all()


@dataclass
class _Held:
    session: Session
    tier: str
    receipt: str
    visibility_ok: bool = True


class HeartbeatHub:
    """Extends the lease and the message visibility of every task this process holds."""

    def __init__(self, store: Any, queues: TaskQueues, config: WorkerConfig) -> None:
        self.store = store
        self.queues = queues
        self.config = config
        self._held: dict[int, _Held] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="beat")
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False)

    @contextmanager
    def track(self, session: Session, tier: str, receipt: str) -> Iterator[None]:
        key = id(session)
        with self._lock:
            self._held[key] = _Held(session, tier, receipt)
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(key, None)

    def _run(self) -> None:
        while not self._stop.wait(self.config.heartbeat_seconds):
            with self._lock:
                held = list(self._held.values())
            if held:
                self.beat(held)

    def beat(self, held: list[_Held]) -> None:
        list(self._pool.map(self._extend_lease, held))
        for tier in TIERS:
            entries = [h for h in held if h.tier == tier and h.visibility_ok and not h.session.lost.is_set()]
            for i in range(0, len(entries), 10):
                self._extend_visibility(tier, entries[i : i + 10])

    def _extend_lease(self, h: _Held) -> None:
        with observe.task_context(task_id=h.session.lease.task_id, lease_epoch=h.session.lease.epoch):
            try:
                h.session.lease = self.store.extend_lease(h.session.lease, self.config.lease_seconds)
            except LeaseLost:
                h.session.lost.set()
            except Exception:
                log.exception("lease heartbeat failed for %s", h.session.lease.task_id)

    def _extend_visibility(self, tier: str, batch: list[_Held]) -> None:
        try:
            resp = self.queues.sqs.change_message_visibility_batch(
                QueueUrl=self.queues.url(tier),
                Entries=[
                    {"Id": str(i), "ReceiptHandle": h.receipt, "VisibilityTimeout": self.config.visibility_seconds}
                    for i, h in enumerate(batch)
                ],
            )
        except Exception:
            log.exception("visibility heartbeat failed on %s", tier)
            return
        for failure in resp.get("Failed", []):
            h = batch[int(failure["Id"])]
            h.visibility_ok = False
            with self._lock:
                still_running = self._held.get(id(h.session)) is h  # ids are reused after free
            if not still_running:
                continue  # the task ended after this beat began: its message was deleted on purpose
            # Our message is gone (deleted through a duplicate's receipt): leave a safety net
            # so that if this process dies, the task still has a message to resume from.
            self.queues.send(h.session.lease.task_id, tier, kind="safety_net", delay_seconds=min(900, int(self.config.visibility_seconds)))


class Worker:
    def __init__(self, settings: Settings, config: WorkerConfig = WorkerConfig(), engine: Engine | None = None) -> None:
        self.settings = settings
        self.config = config
        pool = config.concurrency + 32
        self.store = build_store(settings, pool=pool)
        self.queues = build_queues(settings, pool=pool)
        self.engine = engine or Engine(
            self.store,
            worker_id=worker_id(),
            tools=build_registry(settings),
            config=engine_config(settings, lease_seconds=config.lease_seconds, heartbeat_seconds=config.heartbeat_seconds),
            fanout=build_fanout(settings, pool=pool),
        )
        self.dispatcher = Dispatcher(self.engine, self.queues, max_receive_count=config.max_receive_count)
        self.slots = SlotPool(config.concurrency, config.weights)
        self.hub = HeartbeatHub(self.store, self.queues, config)
        self.stopping = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="task")
        self._pollers: list[threading.Thread] = []
        self.processed = 0

    # ---------------------------------------------------------------- running

    def start(self) -> "Worker":
        self.hub.start()
        for tier in TIERS:
            thread = threading.Thread(target=self._poll, args=(tier,), name=f"poll-{tier}", daemon=True)
            thread.start()
            self._pollers.append(thread)
        return self

    def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT, then drain."""
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        self.start()
        last_flush = time.monotonic()
        while not self.stopping.wait(0.5):
            if time.monotonic() - last_flush > 60:
                observe.flush()
                last_flush = time.monotonic()
        self.shutdown()

    def shutdown(self) -> None:
        """Stop polling; running tasks end at their next step boundary and hand their message back."""
        self.stopping.set()
        for thread in self._pollers:
            thread.join(timeout=self.config.poll_wait_seconds + 5)
        self._executor.shutdown(wait=True, cancel_futures=False)
        self.hub.stop()
        observe.flush()

    # ---------------------------------------------------------------- polling

    def _poll(self, tier: str) -> None:
        url = self.queues.url(tier)
        idle = True  # an idle tier probes with one slot of its own, outside the pool's contest
        while not self.stopping.is_set():
            if idle:
                self.slots.probe(tier)
                granted = 1
            else:
                granted = self.slots.acquire(tier, 10, timeout=0.5)
            if not granted:
                continue
            try:
                resp = self.queues.sqs.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=granted,
                    WaitTimeSeconds=self.config.poll_wait_seconds,
                    VisibilityTimeout=self.config.visibility_seconds,
                    AttributeNames=["ApproximateReceiveCount"],
                    MessageAttributeNames=["All"],
                )
            except Exception:
                log.exception("receive failed on %s", tier)
                self.slots.release(tier, granted)
                time.sleep(1)
                continue
            messages = resp.get("Messages", [])
            self.slots.release(tier, granted - len(messages))
            idle = not messages
            for message in messages:
                if self.stopping.is_set():  # hand it straight back: another worker takes it now
                    self._safe(lambda m=message: self.queues.change_visibility(tier, m["ReceiptHandle"], 0))
                    self.slots.release(tier)
                    continue
                self._executor.submit(self._process, tier, message)

    def _process(self, tier: str, message: dict[str, Any]) -> None:
        receipt = message["ReceiptHandle"]
        try:
            action = self.dispatcher.handle(
                message["Body"],
                tier=tier,
                receive_count=int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
                attributes=message.get("MessageAttributes"),
                keeper=lambda session: self.hub.track(session, tier, receipt),
                stop=self.stopping,
            )
        except Exception as exc:  # a bug or an outage: the message comes back after a pause
            log.exception("task message failed on %s", tier)
            action = Action("retry", f"worker error: {type(exc).__name__}: {exc}", delay_seconds=5)
        finally:
            self.slots.release(tier)
        self._apply(tier, message, action)
        self.processed += 1

    def _apply(self, tier: str, message: dict[str, Any], action: Action) -> None:
        receipt = message["ReceiptHandle"]
        if action.kind == "delete":
            self._safe(lambda: self.queues.delete(tier, receipt))
        elif action.kind == "retry":
            self._safe(lambda: self.queues.change_visibility(tier, receipt, action.delay_seconds))
        elif action.kind == "dead_letter":
            log.warning("dead-lettering message on %s: %s", tier, action.reason)
            self.queues.dead_letter(tier, message["Body"], action.reason, message.get("MessageAttributes"))
            observe.record_dead_letter()
            self._safe(lambda: self.queues.delete(tier, receipt))

    @staticmethod
    def _safe(op: Any) -> None:
        try:
            op()
        except Exception:
            log.exception("SQS call failed")


def run_task(
    task_id: str,
    *,
    settings: Settings | None = None,
    lease_seconds: float = 30.0,
    wait_seconds: float = 0.0,
    poll_seconds: float = 0.1,
) -> RunResult:
    """Run ``task_id`` in this process, no queue involved; if another worker's lease is live,
    retry the claim for up to ``wait_seconds`` (how a replacement picks up a dead one's task)."""
    settings = settings or Settings.from_env()
    store = build_store(settings)
    engine = Engine(
        store,
        worker_id=worker_id(),
        tools=build_registry(settings),
        config=engine_config(settings, lease_seconds=lease_seconds),
        fanout=build_fanout(settings),
    )
    give_up = time.monotonic() + wait_seconds
    while True:
        result = engine.run(task_id)
        if result.outcome != "not_claimed":
            return result
        status = store.get_task(task_id).status
        if status.terminal:
            result.status = status  # nothing left to do: a queue consumer deletes the message
            return result
        if time.monotonic() >= give_up:
            return result
        time.sleep(poll_seconds)
