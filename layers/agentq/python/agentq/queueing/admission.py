"""Admission control: a worker holds no more tasks than its heartbeat can keep.

A held task needs a few writes a heartbeat at most (with worker liveness, a task that waits on
a model call needs none: ``queueing.heartbeat``), and a round of writes must land well inside
the liveness period. ``LeaseWriteRate`` measures what a write costs now and the hub how many a
held task needs per round (``demand``); ``Admission`` turns both into a limit on held tasks;
``SlotPool`` shares that limit between the tier pollers with weighted fair shares."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agentq.queueing._tuning import WorkerConfig

log = logging.getLogger("agentq.worker")


class LeaseWriteRate:
    """How many lease writes a second the heartbeat hub can make right now: its threads over
    the moving average (EWMA) of a write's latency.

    Sampled are the writes the hub itself makes: the worker's liveness renewal (one every
    round, so the estimate exists from the worker's start and never goes stale) and the
    backstop lease extensions. Not claims: a claim is three calls in a row (the conditional
    write, its ``CLAIM#`` record, the submission read) queued behind every held task's step
    commits, so its time measures the store's backlog three times over, not a write; and while
    admission holds claims back there is no new claim to sample, so an estimate made of claims
    froze at its worst (measured: a worker stuck at 625 of 1,000 tasks for minutes on a claim
    time of 30 s while the store served a third of what it could). What is measured is latency,
    not the hub's realised throughput: a hub with little to do extends little, and that must
    not read as a slow store.
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
    slows the store further). So the limit is ``rate x (lease - heartbeat) x safety / demand``,
    where ``rate`` is ``LeaseWriteRate`` and ``demand`` the writes a held task needs per
    heartbeat (1 with a lease write per task; with worker liveness, what the hub measures:
    about one write per backstop half-period, plus the live text of streamed calls); between
    ``floor`` and ``concurrency``. Until the first
    lease write is timed nothing is known, and the worker starts at the floor. The limit
    follows the store both ways: fewer tasks held means fewer calls queued ahead of each
    write, lower latency, and a higher limit. It falls at once but rises to at most twice
    what the worker holds, and at most doubles per heartbeat: a latency measured while
    holding N tasks says little about holding 30 N, and a worker that took 30 N on that
    evidence (say after an idle spell, when one fast claim is all it has seen) would hold
    them all through the slowdown it causes.
    """

    def __init__(
        self,
        config: WorkerConfig,
        rate: LeaseWriteRate,
        clock: Callable[[], float] = time.monotonic,
        demand: Callable[[], float] = lambda: 1.0,
    ) -> None:
        self.concurrency = config.concurrency
        self.floor = max(1, min(config.admission_floor, config.concurrency))
        self.window = max(0.0, config.lease_seconds - config.heartbeat_seconds) * config.admission_safety
        self.doubling_seconds = config.heartbeat_seconds
        self.rate = rate
        self.clock = clock
        self.demand = demand  # writes a held task needs per heartbeat (1.0: a lease write each)
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
        target = max(self.floor, min(self.concurrency, per_second * self.window / max(self.demand(), 1e-3)))
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
        self.in_use = dict.fromkeys(weights, 0)
        self.waiting = dict.fromkeys(weights, 0)
        self.probing = dict.fromkeys(weights, 0)  # idle tiers' long polls, not in the pool
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
