"""The long-running worker (what Fargate runs, and what runs locally): long-polls the tier
queues and runs many tasks at once in one process.

Agents spend their time waiting on LLMs and tools, so a task is a thread and a process holds
hundreds of them. Three pieces keep that cheap and fair:

- ``SlotPool``: the concurrency limit, shared by one poller per tier with weighted fair
  shares (high 6 : normal 3 : low 1 by default). Under contention a freed slot goes to the
  tier furthest below its share, so high goes first and low is never starved.
- ``HeartbeatHub``: one thread extends every held lease and message visibility (batched 10
  per SQS call), instead of a heartbeat thread per task.
- ``Admission``: the pool admits no more tasks than the hub can keep leased. It times every
  lease write (claims and extensions) and caps what the pollers receive at what the hub can
  extend within a fraction of the lease; what it does not take stays in SQS for another worker.
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
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from agentq import observe
from agentq.queueing.dispatch import Action, Dispatcher
from agentq.core.engine import Engine, RunResult, Session
from agentq.core.errors import LeaseLost
from agentq.queueing.queues import TaskQueues
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
    # next receiver can claim at once. Cost: one lease write per task per heartbeat, less the
    # heartbeats a step commit makes unnecessary (it renews the lease in its own write).
    lease_seconds: float = 3.0
    heartbeat_seconds: float = 1.0
    visibility_seconds: int = 4
    poll_wait_seconds: int = 1
    max_receive_count: int = QueueSettings().max_receive_count
    weights: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    drain_seconds: float = 60.0  # how long SIGTERM waits for steps in flight
    # Admission (see ``Admission``): hold at most what ``beat_threads`` lease writes at the
    # measured latency can extend in ``admission_safety`` x (lease - heartbeat) seconds, and
    # never fewer than ``admission_floor`` (or ``concurrency`` if that is lower).
    beat_threads: int = 16
    admission_safety: float = 0.5
    admission_floor: int = 8


class LeaseWriteRate:
    """How many lease writes a second the heartbeat hub can make right now: its threads over
    the moving average (EWMA) of a lease write's latency.

    Claims are sampled too: a claim is the same conditional UpdateItem of META as an
    extension, and every task makes one, so the estimate exists before the first heartbeat
    and follows the store even while tasks are too short to need one. What is measured is
    latency, not the hub's realised throughput: a hub with little to do extends little, and
    that must not read as a slow store.
    """

    def __init__(self, threads: int, alpha: float = 0.2) -> None:
        self.threads = threads
        self.alpha = alpha
        self._latency: float | None = None
        self._lock = threading.Lock()
        self.samples = 0

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.samples += 1
            seconds = max(seconds, 1e-4)
            self._latency = seconds if self._latency is None else self._latency + self.alpha * (seconds - self._latency)

    @property
    def latency(self) -> float | None:
        return self._latency

    def per_second(self) -> float | None:
        latency = self._latency
        return None if latency is None else self.threads / latency


class Admission:
    """How many tasks this worker may hold: as many as the hub can extend in time.

    Every held task needs a lease write each heartbeat, and a round of writes must land well
    inside the lease or leases lapse and other workers take tasks over (correct, since writes
    are fenced, but every takeover repeats the claim, the reads and the step in flight, which
    slows the store further). So the limit is ``rate x (lease - heartbeat) x safety``, where
    ``rate`` is ``LeaseWriteRate``; between ``floor`` and ``concurrency``. Until the first
    lease write is timed nothing is known, and the worker starts at the floor. The limit
    follows the store both ways: fewer tasks held means fewer calls queued ahead of each
    write, lower latency, and a higher limit. It falls at once but rises to at most twice
    what the worker holds, and at most doubles per heartbeat: a latency measured while
    holding N tasks says little about holding 30 N, and a worker that took 30 N on that
    evidence (say after an idle spell, when one fast claim is all it has seen) would hold
    them all through the slowdown it causes.
    """

    def __init__(self, config: WorkerConfig, rate: LeaseWriteRate, clock: Callable[[], float] = time.monotonic) -> None:
        self.concurrency = config.concurrency
        self.floor = max(1, min(config.admission_floor, config.concurrency))
        self.window = max(0.0, config.lease_seconds - config.heartbeat_seconds) * config.admission_safety
        self.doubling_seconds = config.heartbeat_seconds
        self.rate = rate
        self.clock = clock
        self._value = float(self.floor)
        self._at = clock()
        self._value_lock = threading.Lock()
        self.lowest: int | None = None
        self.highest: int | None = None
        self._logged: tuple[int, float] | None = None  # (limit, monotonic time) last logged

    def limit(self, busy: int) -> int:
        """The most tasks to hold now, given that ``busy`` are held (admitted) already."""
        per_second = self.rate.per_second()
        if per_second is None:
            return self.floor
        target = max(self.floor, min(self.concurrency, per_second * self.window))
        with self._value_lock:
            now = self.clock()
            grown = self._value * 2 ** ((now - self._at) / self.doubling_seconds)
            self._value, self._at = min(target, grown, max(self.floor, 2 * busy)), now
            value = int(self._value)
        self.lowest = value if self.lowest is None else min(self.lowest, value)
        self.highest = value if self.highest is None else max(self.highest, value)
        self._log_change(value, per_second)
        return value

    def _log_change(self, value: int, per_second: float) -> None:
        """One line when the limit moves by a quarter or more, at most every 5 s: an operator
        sees a worker capped by a slow store without a line per grant."""
        now = self.clock()
        if self._logged is not None:
            last, at = self._logged
            if abs(value - last) < max(1, last // 4) or now - at < 5:
                return
        self._logged = (value, now)
        log.info(
            "admission: holding at most %d of %d tasks (lease write %.0f ms, %.0f writes/s over %d beat threads)",
            value, self.concurrency, 1000 * (self.rate.latency or 0), per_second, self.rate.threads,
        )  # fmt: skip


class SlotPool:
    """A counting semaphore with weighted fair shares between tiers.

    ``limit``, when given, is asked on every grant (with the slots in use) and may move
    (admission control): slots already granted are kept when it drops; no new ones are
    granted until usage is below it.
    """

    def __init__(self, capacity: int, weights: dict[str, int], limit: Callable[[int], int] | None = None) -> None:
        self.max_capacity = capacity
        self.weights = weights
        self.in_use = {tier: 0 for tier in weights}
        self.waiting = {tier: 0 for tier in weights}
        self.probing = {tier: 0 for tier in weights}  # idle tiers' long polls, not in the pool
        self._limit = limit
        self._cond = threading.Condition()

    @property
    def capacity(self) -> int:
        return self.max_capacity if self._limit is None else min(self.max_capacity, self._limit(self.busy))

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
        """One slot for an idle tier's long poll, outside the pool: a tier whose queue was
        empty must neither keep a busy tier from its last free slots nor count as a contender
        that shrinks the busy tier's share (a lone busy tier gets the whole pool). At most one
        probe per tier, so the pool can run ``capacity + len(tiers)`` tasks at the most."""
        with self._cond:
            self.probing[tier] += 1

    def end_probe(self, tier: str, received: int) -> None:
        """The probe's long poll returned: a message it received takes a slot in the pool."""
        with self._cond:
            self.probing[tier] -= 1
            self.in_use[tier] += received
            self._cond.notify_all()

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


@dataclass(eq=False)
class _Held:
    """One received message, and once claimed, the session running its task."""

    tier: str
    receipt: str
    session: Session | None = None
    visibility_ok: bool = True


class HeartbeatHub:
    """Extends the lease and the message visibility of every task this process holds.

    A message is held from the moment it is received, not from its claim: under load the
    reads before the claim (and the claim itself) can outlast the visibility the receive
    set, and a message that reappears is received again by another worker, which pays
    those reads again only to find the task leased.
    """

    def __init__(self, store: Any, queues: TaskQueues, config: WorkerConfig) -> None:
        self.store = store
        self.queues = queues
        self.config = config
        self.rate = LeaseWriteRate(config.beat_threads)
        self.counts: Counter[str] = Counter()  # rounds, overruns, extended, refused, skipped_fresh
        self.held_max = 0
        self._held: set[_Held] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=config.beat_threads, thread_name_prefix="beat")
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False)

    @property
    def held(self) -> int:
        """Tasks claimed and running here (received messages not yet claimed excluded)."""
        with self._lock:
            return self._claimed()

    def _claimed(self) -> int:
        """Held messages whose task is claimed here (callers hold the lock)."""
        return sum(1 for h in self._held if h.session is not None)

    @contextmanager
    def hold(self, tier: str, receipt: str) -> Iterator[_Held]:
        """Keep a received message invisible until its task is done with it."""
        held = _Held(tier, receipt)
        with self._lock:
            self._held.add(held)
        try:
            yield held
        finally:
            with self._lock:
                self._held.discard(held)

    @contextmanager
    def track(self, held: _Held, session: Session) -> Iterator[None]:
        """Keep the lease of ``session``, claimed through ``held``'s message, alive."""
        if session.claim_seconds:
            self.rate.observe(session.claim_seconds)
        with self._lock:
            held.session = session
            self.held_max = max(self.held_max, self._claimed())
        try:
            yield
        finally:
            with self._lock:
                held.session = None

    def _run(self) -> None:
        """Rounds at a fixed rate: each is due ``heartbeat_seconds`` after the previous one
        started, not after it ended, so a slow round does not push every lease closer to
        expiry. A round that overruns its slot is followed at once by the next (counted as
        ``overruns``), never by a burst of catch-up rounds."""
        period = self.config.heartbeat_seconds
        due = time.monotonic() + period
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            started = time.monotonic()
            with self._lock:
                held = [(h, h.session) for h in self._held]
            if held:
                self._count("rounds")
                self.beat(held)
            due = started + period
            if time.monotonic() > due:
                self._count("overruns")

    def beat(self, held: list[tuple[_Held, Session | None]]) -> None:
        """One round: every visibility batch and every lease write go to the pool at once,
        the leases closest to expiry first; returns when all have landed."""
        now = time.time()
        live = [(h, s) for h, s in held if s is not None and not s.lost.is_set()]
        leased = sorted(((h, s) for h, s in live if not self._fresh(s, now)), key=lambda e: e[1].lease.expires_at)
        if len(leased) < len(live):
            self._count("skipped_fresh", len(live) - len(leased))
        jobs = []
        for tier in TIERS:
            entries = [h for h, s in held if h.tier == tier and h.visibility_ok and not (s is not None and s.lost.is_set())]
            jobs += [self._pool.submit(self._extend_visibility, tier, entries[i : i + 10]) for i in range(0, len(entries), 10)]
        jobs += [self._pool.submit(self._extend_lease, entry) for entry in leased]
        wait(jobs)

    def _fresh(self, session: Session, now: float) -> bool:
        """Was this lease written less than half a heartbeat ago, by its claim or a step
        commit (one on the wire counts: it renews the lease or ends the task)? Then it is
        left for the next round. The hub's own writes are a heartbeat old by then, so only
        progress between rounds saves a write, and the gap between two writes of a lease
        stays under 1.5 heartbeats."""
        written = max(session.lease.expires_at - self.config.lease_seconds, session.commit_sent_at or 0.0)
        return now - written < self.config.heartbeat_seconds / 2

    def _extend_lease(self, entry: tuple[_Held, Session]) -> None:
        h, session = entry
        if h.session is not session:
            return  # the task ended while this write waited for a beat thread: nothing to keep
        with observe.task_context(task_id=session.lease.task_id, lease_epoch=session.lease.epoch):
            sent = time.monotonic()
            try:
                session.lease = self.store.extend_lease(session.lease, self.config.lease_seconds)
                self._count("extended")
            except LeaseLost:
                # Taken over by another worker, or dropped by the task itself (it finished or was
                # released) while this write was on the wire: the store cannot tell us which.
                session.lost.set()
                self._count("refused")
            except Exception:
                log.exception("lease heartbeat failed for %s", session.lease.task_id)
            finally:
                self.rate.observe(time.monotonic() - sent)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

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
                session = h.session if h in self._held else None
            if session is None:
                # The task ended after this beat began (its message was deleted on purpose),
                # or it was never claimed here: either way nothing of ours needs the message.
                continue
            # Our message is gone (deleted through a duplicate's receipt): leave a safety net
            # so that if this process dies, the task still has a message to resume from.
            try:
                self.queues.send(session.lease.task_id, tier, kind="safety_net", delay_seconds=min(900, int(self.config.visibility_seconds)))
            except Exception:
                log.exception("safety-net message for %s failed", session.lease.task_id)


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
        self.hub = HeartbeatHub(self.store, self.queues, config)
        self.admission = Admission(config, self.hub.rate)
        self.slots = SlotPool(config.concurrency, config.weights, limit=self.admission.limit)
        self.stopping = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="task")
        self._pollers: list[threading.Thread] = []
        self.processed = 0

    def stats(self) -> dict[str, Any]:
        """What admission and the heartbeat are doing, for logs, benchmarks and tests."""
        latency = self.hub.rate.latency
        per_second = self.hub.rate.per_second()
        with self.hub._lock:
            counts = dict(self.hub.counts)
        return {
            "concurrency": self.config.concurrency,
            "admission_limit": self.admission.limit(self.slots.busy),
            "admission_limit_min": self.admission.lowest,
            "admission_limit_max": self.admission.highest,
            "admitted": self.slots.busy,
            "held": self.hub.held,
            "held_max": self.hub.held_max,
            "lease_write_latency_s": None if latency is None else round(latency, 4),
            "lease_writes_per_s": None if per_second is None else round(per_second, 1),
            "lease_write_samples": self.hub.rate.samples,
            **{f"beat_{k}": v for k, v in sorted(counts.items())},
        }

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
            probing = idle
            if probing:
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
                if probing:
                    self.slots.end_probe(tier, 0)
                else:
                    self.slots.release(tier, granted)
                time.sleep(1)
                continue
            messages = resp.get("Messages", [])
            if probing:
                self.slots.end_probe(tier, len(messages))
            else:
                self.slots.release(tier, granted - len(messages))
            idle = not messages
            for message in messages:
                if self.stopping.is_set():  # hand it straight back: another worker takes it now
                    self._safe(lambda m=message: self.queues.change_visibility(tier, m["ReceiptHandle"], 0))
                    self.slots.release(tier)
                    continue
                self._executor.submit(self._process, tier, message)

    def _process(self, tier: str, message: dict[str, Any]) -> None:
        try:
            with self.hub.hold(tier, message["ReceiptHandle"]) as held:
                action = self.dispatcher.handle(
                    message["Body"],
                    tier=tier,
                    receive_count=int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
                    attributes=message.get("MessageAttributes"),
                    keeper=lambda session: self.hub.track(held, session),
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
