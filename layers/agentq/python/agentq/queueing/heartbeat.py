"""The heartbeat hub: one place that extends the lease and the message visibility of every
task a worker process holds (fixed-rate, closest to expiry first, visibility in batches of 10)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agentq import observe
from agentq.core.engine import LeaseState
from agentq.core.errors import LeaseLost
from agentq.queueing._tuning import WorkerConfig
from agentq.queueing.admission import LeaseWriteRate
from agentq.queueing.queues import TaskQueues
from agentq.resources import TIERS

log = logging.getLogger("agentq.worker")


@dataclass(eq=False)
class _Held:
    """One received message, and once claimed, the lease state of the run working on its task."""

    tier: str
    receipt: str
    lease_state: LeaseState | None = None
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
        return sum(1 for h in self._held if h.lease_state is not None)

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
    def track(self, held: _Held, state: LeaseState) -> Iterator[None]:
        """Keep the lease of ``state``, claimed through ``held``'s message, alive."""
        if state.claim_seconds:
            self.rate.observe(state.claim_seconds)
        with self._lock:
            held.lease_state = state
            self.held_max = max(self.held_max, self._claimed())
        try:
            yield
        finally:
            with self._lock:
                held.lease_state = None

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
                held = [(h, h.lease_state) for h in self._held]
            if held:
                self._count("rounds")
                self.beat(held)
            due = started + period
            if time.monotonic() > due:
                self._count("overruns")

    def beat(self, held: list[tuple[_Held, LeaseState | None]]) -> None:
        """One round: every visibility batch and every lease write go to the pool at once,
        the leases closest to expiry first; returns when all have landed."""
        now = time.time()
        live = [(h, s) for h, s in held if s is not None and not s.lost.is_set()]
        leased = sorted(((h, s) for h, s in live if not self._fresh(s, now)), key=lambda e: e[1].lease.expires_at)
        if len(leased) < len(live):
            self._count("skipped_fresh", len(live) - len(leased))
        jobs = []
        for tier in TIERS:
            entries = [
                h for h, s in held if h.tier == tier and h.visibility_ok and not (s is not None and s.lost.is_set())
            ]
            jobs += [
                self._pool.submit(self._extend_visibility, tier, entries[i : i + 10])
                for i in range(0, len(entries), 10)
            ]
        jobs += [self._pool.submit(self._extend_lease, entry) for entry in leased]
        wait(jobs)

    def _fresh(self, state: LeaseState, now: float) -> bool:
        """Was this lease written less than half a heartbeat ago, by its claim or a step
        commit (one on the wire counts: it renews the lease or ends the task)? Then it is
        left for the next round. The hub's own writes are a heartbeat old by then, so only
        progress between rounds saves a write, and the gap between two writes of a lease
        stays under 1.5 heartbeats."""
        written = max(state.lease.expires_at - self.config.lease_seconds, state.commit_sent_at or 0.0)
        return now - written < self.config.heartbeat_seconds / 2

    def _extend_lease(self, entry: tuple[_Held, LeaseState]) -> None:
        h, state = entry
        if h.lease_state is not state:
            return  # the task ended while this write waited for a beat thread: nothing to keep
        with observe.task_context(task_id=state.lease.task_id, lease_epoch=state.lease.epoch):
            sent = time.monotonic()
            try:
                state.lease = self.store.tasks.extend_lease(
                    state.lease, self.config.lease_seconds, live_text=state.live_text
                )
                self._count("extended")
            except LeaseLost:
                # Taken over by another worker, or dropped by the task itself (it finished or was
                # released) while this write was on the wire: the store cannot tell us which.
                state.lost.set()
                self._count("refused")
            except Exception:
                log.exception("lease heartbeat failed for %s", state.lease.task_id)
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
                state = h.lease_state if h in self._held else None
            if state is None:
                # The task ended after this beat began (its message was deleted on purpose),
                # or it was never claimed here: either way nothing of ours needs the message.
                continue
            # Our message is gone (deleted through a duplicate's receipt): leave a safety net
            # so that if this process dies, the task still has a message to resume from.
            try:
                self.queues.send(
                    state.lease.task_id,
                    tier,
                    kind="safety_net",
                    delay_seconds=min(900, int(self.config.visibility_seconds)),
                )
            except Exception:
                log.exception("safety-net message for %s failed", state.lease.task_id)
