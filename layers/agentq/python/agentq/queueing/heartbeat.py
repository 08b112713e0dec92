"""The heartbeat hub: one thread keeps every task a worker process holds alive, with one
liveness write per process per heartbeat instead of a lease write per task.

Each round (fixed rate, ``heartbeat_seconds``) it renews the worker's liveness item
(``storage.workers``: one write), reads those of the few peers it watches (one Query, two for
the last workers in the ring) and hands on the tasks of a peer found dead
(``queueing.recovery``); the watch runs beside the round and never delays the next renewal. Per held task it writes only what a task needs now:
the task's own lease when that backstop comes within half of its length of expiring (a task
silent for minutes: a long tool call), the live text of a streamed call when it changed, and
its message's visibility, long (``held_visibility_seconds``) once claimed and extended in
batches of 10 when half of it is left. A task that merely waits on a model call costs nothing.
A task whose shell may reach the network (its egress proxy armed) has its META read every
``stop_look_seconds`` instead (one BatchGetItem for up to 100 such tasks, ``_look``): a stop's
mark found there kills that shell then, not when its lease write next comes due.

A worker that learns its liveness lapsed (a renewal refused: it was paused, or partitioned,
past its liveness and a peer declared it dead) starts a new epoch and reads the META of every
task it holds (BatchGetItem): those still its own (same ``lease_epoch``) are re-adopted under
the new epoch, the rest are marked lost, so their runs stop at their next check. While its
renewals fail for another reason (its liveness writes fail while its task writes do not), it
cannot know whether it was declared dead, so past a liveness period it reads them all each
round and marks lost what was taken over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from agentq import observe
from agentq.core.engine import LeaseState
from agentq.core.errors import LeaseLost
from agentq.core.records import ClaimOwner
from agentq.core.reservation import Seen
from agentq.queueing._tuning import WorkerConfig
from agentq.queueing.admission import LeaseWriteRate
from agentq.queueing.queues import TaskQueues
from agentq.queueing.recovery import PeerWatch, recover
from agentq.resources import TIERS
from agentq.storage.workers import LivenessLapsed, WorkerLife

log = logging.getLogger("agentq.worker")


@dataclass(eq=False)
class _Held:
    """One received message, and once claimed, the lease state of the run working on its task."""

    tier: str
    receipt: str
    lease_state: LeaseState | None = None
    visibility_ok: bool = True
    visible_at: float = 0.0  # monotonic: when the message would be visible again
    published: tuple[str | None, Seen | None] = (None, None)  # the live text and seen usage last on META
    looked_at: float = 0.0  # monotonic: when the heartbeat last read its task's META for a stop (``_look``)
    ran: list[LeaseState] = field(default_factory=list)  # the runs claimed through it, disowned when it is let go


class HeartbeatHub:
    """Keeps every task this process holds alive (see the module).

    A message is held from the moment it is received, not from its claim: under load the
    reads before the claim (and the claim itself) can outlast the visibility the receive
    set, and a message that reappears is received again by another worker, which pays
    those reads again only to find the task leased.
    """

    def __init__(self, store: Any, queues: TaskQueues, config: WorkerConfig, worker_id: str = "worker") -> None:
        self.store = store
        self.queues = queues
        self.config = config
        self.worker_id = worker_id
        self.rate = LeaseWriteRate(config.beat_threads)
        # rounds, overruns, extended, refused, liveness_renewed, liveness_lapsed, visibility_calls,
        # live_text, peers_read (Queries), peer_items_read, recovered, lost_found, looked (tasks whose
        # META a look read), looked_lost (of those, no longer running under their lease: stopped)
        self.counts: Counter[str] = Counter()
        self.held_max = 0
        # Per-task writes a held task needed per round (EWMA), which admission divides by:
        # starts at one (a lease write each), falls to what the rounds really write.
        self._demand = 1.0
        self.life: WorkerLife | None = None
        self._renewed_at = time.monotonic()
        self.peers = PeerWatch(worker_id, config.lease_seconds)
        self._small_fleet = False  # the last read of the peers saw every one (storage.workers.successors)
        self._held: set[_Held] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=config.beat_threads, thread_name_prefix="beat")
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        sent = time.monotonic()
        self.life = self.store.tasks.workers.start(self.worker_id, self.config.lease_seconds)
        self._renewed_at = time.monotonic()
        self.rate.observe(self._renewed_at - sent)  # admission has an estimate before the first claim
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False)
        if self.life is not None:
            try:
                self.store.tasks.workers.stop(self.life)
            except Exception:
                log.warning("could not remove the liveness item of %s", self.worker_id, exc_info=True)

    def owner(self, held: _Held) -> ClaimOwner | None:
        """What a claim through ``held``'s message records: this process, its liveness epoch,
        and the message (so a peer that finds this process dead can make it visible again)."""
        if self.life is None:
            return None
        return ClaimOwner(self.worker_id, self.life.epoch, held.receipt, held.tier)

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
        """Keep a received message invisible until its task is done with it. A task claimed
        through it leaves this worker's ``owner`` index only now, once the dispatcher has done
        what follows its run (reported its end to a fan-out parent, its callback, its
        dependents; given back its slots): if this process dies before, a peer's recovery finds
        the task still owned and makes its message visible again, and the redelivery does it.
        Disowned at the run's end, an ended task's message stayed invisible for the claimed
        ``held_visibility_seconds`` (10 minutes), and a fan-out parent waited that long."""
        held = _Held(tier, receipt, visible_at=time.monotonic() + self.config.visibility_seconds)
        with self._lock:
            self._held.add(held)
        try:
            yield held
        finally:
            with self._lock:
                self._held.discard(held)
            for state in held.ran:
                try:
                    self.store.tasks.disown(state.lease)
                except Exception:  # best effort: a recovery filters on epoch, its redelivery on status
                    log.warning("could not disown task %s", state.lease.task_id, exc_info=True)

    @contextmanager
    def track(self, held: _Held, state: LeaseState) -> Iterator[None]:
        """Keep the task of ``state``, claimed through ``held``'s message, alive while it runs
        (its ``owner`` entry is removed when ``held`` is let go, see ``hold``)."""
        with self._lock:
            held.lease_state = state
            held.ran.append(state)
            self.held_max = max(self.held_max, self._claimed())
        try:
            yield
        finally:
            with self._lock:
                held.lease_state = None

    def _run(self) -> None:
        """Rounds at a fixed rate: each is due ``heartbeat_seconds`` after the previous one
        started, not after it ended, so a slow round does not push the liveness closer to
        expiry. A round that overruns its slot is followed at once by the next (counted as
        ``overruns``), never by a burst of catch-up rounds. Watching the peers runs beside the
        round, on a beat thread, and no round waits for it: its Query on a slow store, or the
        recovery of a dead peer's thousand tasks, never delays this worker's own renewal (it
        would be declared dead for handing on another's tasks); a watch still running when the
        next is due is not doubled."""
        period = self.config.heartbeat_seconds
        due = time.monotonic() + period
        watching: Future[None] | None = None
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            started = time.monotonic()
            self._count("rounds")
            self.renew()
            if watching is None or watching.done():
                watching = self._pool.submit(self.watch_peers)
            with self._lock:
                held = [(h, h.lease_state) for h in self._held]
            if held:
                self.beat(held)
            due = started + period
            if time.monotonic() > due:
                self._count("overruns")

    # ------------------------------------------------------------------ liveness

    def renew(self) -> None:
        """This process's one liveness write; what to do when it is refused or fails."""
        if self.life is None:
            return
        workers = self.store.tasks.workers
        sent = time.monotonic()
        try:
            self.life = workers.renew(self.life, self.config.lease_seconds)
            self._renewed_at = time.monotonic()
            self.rate.observe(self._renewed_at - sent)  # one sample a round: the estimate never goes stale
            self._count("liveness_renewed")
        except LivenessLapsed:
            self._count("liveness_lapsed")
            log.warning("worker %s: liveness epoch %s was declared dead; starting a new one", self.worker_id,
                        self.life.epoch)  # fmt: skip
            self.life = workers.start(self.worker_id, self.config.lease_seconds)
            self._renewed_at = time.monotonic()
            self.recheck(adopt=True)
        except Exception as exc:  # an outage of the table (or of this host's path to it): one line a beat
            log.warning("liveness renewal failed for %s: %s: %s", self.worker_id, type(exc).__name__, exc)
            if time.monotonic() - self._renewed_at > self.config.lease_seconds:
                self.recheck(adopt=False)  # perhaps declared dead: find what was taken over

    def alive(self) -> bool:
        """Was this process's liveness renewed within its period? A worker whose liveness
        writes fail takes no new task: its peers may declare it dead at any moment (and its
        claims, recorded under that epoch, would be theirs to take at once)."""
        return self.life is not None and time.monotonic() - self._renewed_at <= self.config.lease_seconds

    def recheck(self, *, adopt: bool) -> None:
        """Lease-loss detection after a lapse: read every held task's META at once; those taken
        over are marked lost, those still this process's are re-adopted (``adopt``)."""
        with self._lock:
            states = [(h, h.lease_state) for h in self._held]
        live = [(h, s) for h, s in states if s is not None and not s.lost.is_set()]
        ids = [s.lease.task_id for _, s in live]
        metas: dict[str, dict[str, Any]] = {}
        try:
            for i in range(0, len(ids), 100):
                metas.update({str(m["task_id"]): m for m in self.store.tasks.metas(ids[i : i + 100])})
        except Exception:
            log.exception("could not read the tasks %s holds", self.worker_id)
            return
        for h, state in live:
            meta = metas.get(state.lease.task_id)
            ours = (
                meta is not None
                and int(meta.get("lease_epoch", 0)) == state.lease.epoch
                and meta.get("status") == "running"
            )
            if ours and adopt:
                owner = self.owner(h)
                ours = owner is not None and self.store.tasks.adopt(state.lease, owner)
            if not ours:
                state.lost.set()
                self._count("lost_found")
                log.info("task %s was taken over while %s lapsed", state.lease.task_id, self.worker_id)

    def watch_peers(self) -> None:
        """Read the liveness of the workers this one watches (its successors, ``storage.workers``:
        one or two Queries of a few items, whatever the fleet); hand on the tasks of any found dead."""
        try:
            watched = self.store.tasks.workers.successors(self.worker_id, small=self._small_fleet)
            self._small_fleet = watched.whole
            self._count("peers_read", watched.queries)
            self._count("peer_items_read", watched.items)
            for peer in self.peers.dead(watched.peers):
                if recover(self.store, self.queues, peer):
                    self._count("recovered")
        except Exception:
            log.exception("watching the other workers failed")

    # ------------------------------------------------------------------ per task

    def beat(self, held: list[tuple[_Held, LeaseState | None]]) -> None:
        """One round of per-task work: the visibility batches due and the lease and live text
        writes due go to the pool at once; returns when all have landed."""
        now, clock = time.time(), time.monotonic()
        live = [(h, s) for h, s in held if s is not None and not s.lost.is_set()]
        leased = sorted(((h, s) for h, s in live if self._lease_due(s, now)), key=lambda e: e[1].lease.expires_at)
        texts = [(h, s) for h, s in live if (s.live_text or s.seen) and (s.live_text, s.seen) != h.published]
        jobs = []
        for tier in TIERS:
            entries = [
                h
                for h, s in held
                if h.tier == tier and h.visibility_ok and not (s is not None and s.lost.is_set())
                and self._visibility_due(h, s, clock)
            ]  # fmt: skip
            jobs += [
                self._pool.submit(self._extend_visibility, tier, entries[i : i + 10])
                for i in range(0, len(entries), 10)
            ]
        jobs += [self._pool.submit(self._extend_lease, entry) for entry in leased]
        jobs += [self._pool.submit(self._publish, entry) for entry in texts]
        looks = [(h, s) for h, s in live if self._look_due(h, s, clock)]
        jobs += [self._pool.submit(self._look, looks[i : i + 100]) for i in range(0, len(looks), 100)]
        if live:
            floor = self.config.heartbeat_seconds / (self.config.task_lease_seconds / 2)
            sample = max(floor, (len(leased) + len(texts)) / len(live))
            self._demand += 0.2 * (sample - self._demand)
        wait(jobs)

    def demand(self) -> float:
        """Per-task writes a held task needs per heartbeat, as measured (see ``Admission``)."""
        return self._demand

    def _lease_due(self, state: LeaseState, now: float) -> bool:
        """A task's own lease is a backstop under the worker's liveness: renewed only when half
        of it is left (a step commit renews it too, in its own write)."""
        written = max(state.lease.expires_at - self.config.task_lease_seconds, state.commit_sent_at or 0.0)
        return now - written >= self.config.task_lease_seconds / 2

    def _look_due(self, h: _Held, state: LeaseState, clock: float) -> bool:
        """A task whose shell may reach the network (``LeaseState.reaching_since``) is looked at
        every ``stop_look_seconds`` from the call's start: nothing else but a write would tell
        this worker of a stop while it runs, and its lease write may be minutes away."""
        since = state.reaching_since
        return since is not None and clock - max(since, h.looked_at) >= self.config.stop_look_seconds

    def _look(self, entries: list[tuple[_Held, LeaseState]]) -> None:
        """Read the METAs of ``entries``' tasks (one BatchGetItem): a task that no longer runs
        under its lease (a stop's mark, a cancel, a takeover) is lost (``LeaseState.lose``), which
        kills its sandbox at once and ends its run as the store's reason says."""
        clock = time.monotonic()
        for h, _ in entries:
            h.looked_at = clock
        try:
            fenced = self.store.tasks.fenced_out([s.lease for _, s in entries])
        except Exception:
            log.exception("could not look at the tasks whose shells reach the network")
            return
        self._count("looked", len(entries))
        for h, state in entries:
            why = fenced.get(state.lease.task_id)
            if why is not None and h.lease_state is state:  # not a run that ended meanwhile
                state.lose(why)
                self._count("looked_lost")
                log.info("task %s no longer runs here: %s", state.lease.task_id, why.message)

    def _visibility_due(self, h: _Held, state: LeaseState | None, clock: float) -> bool:
        """A message not yet claimed is kept invisible a short while at a time (its task may
        turn out to be leased elsewhere); a claimed one for ``held_visibility_seconds``,
        renewed when half of that is left."""
        if state is None:
            return h.visible_at - clock < self.config.visibility_seconds
        return h.visible_at - clock < self.config.held_visibility_seconds / 2

    def _extend_lease(self, entry: tuple[_Held, LeaseState]) -> None:
        h, state = entry
        if h.lease_state is not state:
            return  # the task ended while this write waited for a beat thread: nothing to keep
        with observe.task_context(task_id=state.lease.task_id, lease_epoch=state.lease.epoch):
            sent = time.monotonic()
            try:
                state.lease = self.store.tasks.extend_lease(state.lease, self.config.task_lease_seconds)
                self._count("extended")
            except LeaseLost as exc:
                # Taken over by another worker, marked by a stop, or dropped by the task itself (it
                # finished or was released) while this write was on the wire: the run, if it is
                # still on, ends as the store's reason says (``LeaseState.lose``).
                state.lose(exc)
                self._count("refused")
            except Exception:
                log.exception("lease heartbeat failed for %s", state.lease.task_id)
            finally:
                self.rate.observe(time.monotonic() - sent)

    def _publish(self, entry: tuple[_Held, LeaseState]) -> None:
        """The live text of a streamed call, and what it billed so far (``Seen``), when either
        changed since the last round's."""
        h, state = entry
        text, seen = state.live_text, state.seen
        if h.lease_state is not state or not (text or seen):
            return
        try:
            self.store.tasks.publish_live_text(state.lease, text, seen)
            h.published = (text, seen)
            self._count("live_text")
        except LeaseLost as exc:
            state.lose(exc)
            self._count("refused")
        except Exception:
            log.exception("live text of %s not written", state.lease.task_id)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def _extend_visibility(self, tier: str, batch: list[_Held]) -> None:
        timeouts = [
            self.config.visibility_seconds if h.lease_state is None else self.config.held_visibility_seconds
            for h in batch
        ]
        sent = time.monotonic()
        try:
            self._count("visibility_calls")
            resp = self.queues.sqs.change_message_visibility_batch(
                QueueUrl=self.queues.url(tier),
                Entries=[
                    {"Id": str(i), "ReceiptHandle": h.receipt, "VisibilityTimeout": timeouts[i]}
                    for i, h in enumerate(batch)
                ],
            )
        except Exception:
            log.exception("visibility heartbeat failed on %s", tier)
            return
        failed = {int(f["Id"]) for f in resp.get("Failed", [])}
        for i, h in enumerate(batch):
            if i not in failed:
                h.visible_at = sent + timeouts[i]
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
                    tenant=state.tenant,
                )
            except Exception:
                log.exception("safety-net message for %s failed", state.lease.task_id)
