"""Worker liveness: one item per worker process, renewed each heartbeat, instead of a lease
write per held task.

A worker process keeps ``WORKERS`` / ``<worker id>`` with its ``epoch`` (unique per start of
its liveness), a ``beat`` counter it bumps on every renewal and ``alive_until`` (its clock +
the liveness period). A claim made under it records the owner and that epoch on the task's
META (``storage.leases``); the task's own lease (``lease_epoch``, the fence every worker write
carries) is unchanged, so safety never rests on this item: a worker whose tasks were taken
over fails its next fenced write, as before. This item only decides *when* a takeover is
allowed, and costs one write per worker per heartbeat whatever the number of tasks it holds.

Death is judged without comparing clocks: a peer is dead when its ``beat`` has not moved for
a liveness period of the *observer's* monotonic clock (``queueing.recovery``). The observer
then marks the epoch ``recovered`` (conditional on the beat it saw, so a renewal that raced it
wins), and from then on the owner can renew nothing (``renew`` requires the item unmarked): a
paused worker that wakes learns it lapsed and starts a new epoch. ``lapsed`` is what a claim
asks: the owner's item is gone, moved to another epoch, marked recovered, or (for claimants
that never observed it, such as a Lambda slice) its ``alive_until`` is older than
``SKEW_ALLOWANCE_SECONDS`` by the claimant's clock.

The sweeper, the backstop when every watcher died too, runs on another host every few minutes
and keeps no memory between passes, so it cannot watch a beat on a clock of its own the way a
peer does. Its wall clock only picks *suspects* (``alive_until`` older than the skew allowance):
it marks each with the beat it saw and when, by its own clock (``suspect``), and a later pass
declares the worker dead only if the beat has not moved since, a liveness period and the skew
allowance later by the same sweeper's clock. A live worker whose clock is a minute behind beats
on and stays a suspect forever, never dead; a write per pass per suspect is what it costs.

Who watches whom: each worker reads only the ``WATCHED_PEERS`` workers after it in the order of
worker ids, wrapping around (``successors``: one Query of at most that many items after its own,
a second from the start when it is among the last, one Query of the partition in a fleet that
small), so every worker is watched by as many
predecessors and a worker's reads per heartbeat do not grow with the fleet. Reading every
peer's item each heartbeat (as a first version did) costs each worker read units in proportion
to the fleet, the fleet in proportion to its square. When a worker and the ones watching it
die at once, the nearest live predecessor sees its successors dead, recovers them (their items
go) and reads further on the next heartbeat; the sweeper's pass reads every item as a backstop.

The items share one partition, so that the successors are one Query; that partition takes
one write per worker per heartbeat, far below a partition's 1,000 writes/s, for up to a few
hundred worker processes.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from decimal import Decimal

from boto3.dynamodb.conditions import Attr

from agentq.storage.table import ConditionFailed, Item, Table, Update, plain

WORKERS_PK = "WORKERS"
# How many workers each worker watches (its successors in the order of worker ids): the first
# to notice a death is the first of them to read after the liveness period, so more watchers
# buy nothing in resume time, only against several neighbours dying at once.
WATCHED_PEERS = 2
_LAST_ID = "\U0010ffff"  # above every worker id in DynamoDB's (UTF-8) order of sort keys
# A claimant that never watched the owner's beat judges it by wall clocks: this much skew
# between two hosts never makes a live worker look dead.
SKEW_ALLOWANCE_SECONDS = 10.0


class LivenessLapsed(Exception):
    """This worker's liveness epoch was declared dead (or replaced): its claims may be taken."""


@dataclass(frozen=True)
class WorkerLife:
    """One epoch of one worker process's liveness, as its owner last renewed it."""

    worker: str
    epoch: int
    beat: int
    alive_until: float


@dataclass(frozen=True)
class PeerBeat:
    """A worker's liveness item as another worker reads it."""

    worker: str
    epoch: int
    beat: int
    alive_until: float
    recovered: bool
    # The sweeper's mark (``WorkerLiveness.suspect``): the beat it saw and when, by its clock.
    suspect_beat: int | None = None
    suspect_at: float | None = None
    period: float = 0.0  # the liveness period the worker renews for (0: an item from before it)


@dataclass(frozen=True)
class Watched:
    """What one read of a worker's successors found, what it cost (Queries, items read), and
    whether it saw the whole fleet (the next read may then try one Query of the partition)."""

    peers: list[PeerBeat]
    queries: int
    items: int
    whole: bool = False


def _ring(me: str, count: int, items: list[Item], *, queries: int, read: int, whole: bool) -> Watched:
    """The first ``count`` workers after ``me`` among ``items`` (in the order of worker ids,
    wrapping around), ``me`` and repeats left out."""
    ids = sorted({str(i["sk"]): i for i in items}.items())
    ring = [i for sk, i in ids if sk > me] + [i for sk, i in ids if sk < me]
    return Watched([_beat(i) for i in ring[:count]], queries=queries, items=read, whole=whole)


def _beat(item: Item) -> PeerBeat:
    d = plain(item)
    return PeerBeat(
        worker=str(d["sk"]),
        epoch=int(d["epoch"]),
        beat=int(d.get("beat", 0)),
        alive_until=float(d.get("alive_until", 0)),
        recovered=d.get("recovered") is not None,
        suspect_beat=int(d["suspect_beat"]) if d.get("suspect_beat") is not None else None,
        suspect_at=float(d["suspect_at"]) if d.get("suspect_at") is not None else None,
        period=float(d.get("period", 0)),
    )


def _key(worker: str) -> dict[str, str]:
    return {"pk": WORKERS_PK, "sk": worker}


def _time(seconds: float) -> Decimal:
    return Decimal(repr(round(seconds, 3)))


class WorkerLiveness:
    def __init__(self, table: Table) -> None:
        self.table = table

    def start(self, worker: str, seconds: float) -> WorkerLife:
        """A new epoch for ``worker`` (at start, or after learning it lapsed). The epoch is the
        start time in microseconds: unique per worker id, and never reused, so a claim recorded
        under an older epoch stays claimable once a newer one replaced it."""
        now = time.time()
        epoch = time.time_ns() // 1000
        self.table.put(
            {**_key(worker), "epoch": epoch, "beat": 0, "alive_until": _time(now + seconds), "period": _time(seconds)}
        )
        return WorkerLife(worker, epoch, 0, now + seconds)

    def renew(self, life: WorkerLife, seconds: float) -> WorkerLife:
        """One heartbeat; ``LivenessLapsed`` if the epoch was declared dead or replaced."""
        until = time.time() + seconds
        try:
            self.table.update(
                _key(life.worker),
                Update(set={"alive_until": _time(until)}, add={"beat": 1}),
                condition=Attr("epoch").eq(life.epoch) & Attr("recovered").not_exists(),
            )
        except ConditionFailed as exc:
            raise LivenessLapsed(f"worker {life.worker} epoch {life.epoch} was declared dead") from exc
        return WorkerLife(life.worker, life.epoch, life.beat + 1, until)

    def stop(self, life: WorkerLife) -> None:
        """A worker leaving (after it handed back its tasks): its item goes, if still its own."""
        with contextlib.suppress(ConditionFailed):
            self.table.delete(_key(life.worker), condition=Attr("epoch").eq(life.epoch))

    def peers(self) -> list[PeerBeat]:
        """Every worker's liveness item: one Query of one partition (the sweeper's pass)."""
        return [_beat(i) for i in self.table.query(WORKERS_PK)]

    def successors(self, me: str, count: int = WATCHED_PEERS, *, small: bool = False) -> Watched:
        """The items of the ``count`` workers after ``me`` in the order of worker ids, wrapping
        around (``me`` excluded; fewer when the fleet is smaller): what one worker watches.

        One Query of ``count + 1`` items from ``me`` on; a second from the first worker when
        ``me`` is among the last. ``small``: the last read saw the whole fleet (``Watched.whole``),
        so one Query of the partition, ``count + 2`` items at most, is tried first: it is the
        whole fleet again unless the fleet grew, and a fleet of three or fewer costs one Query
        a round instead of two."""
        if small:
            items = self.table.query(WORKERS_PK, limit=count + 2)
            if len(items) <= count + 1:
                return _ring(me, count, items, queries=1, read=len(items), whole=True)
            queries, read = 1, len(items)
        else:
            queries, read = 0, 0
        after = self.table.query(WORKERS_PK, between=(me, _LAST_ID), limit=count + 1)
        queries, read = queries + 1, read + len(after)
        if len(after) == count + 1:
            return _ring(me, count, after, queries=queries, read=read, whole=False)
        first = self.table.query(WORKERS_PK, limit=count + 1)  # among the last: the ring goes on from the first
        seen = {str(i["sk"]) for i in after}
        whole = len(first) < count + 1 or any(str(i["sk"]) in seen for i in first)
        return _ring(me, count, after + first, queries=queries + 1, read=read + len(first), whole=whole)

    def mark_recovered(self, peer: PeerBeat) -> bool:
        """Declare ``peer``'s epoch dead, if its beat has not moved since it was read and nobody
        declared it first: exactly one observer recovers its tasks."""
        try:
            self.table.update(
                _key(peer.worker),
                Update(set={"recovered": _time(time.time())}),
                condition=Attr("epoch").eq(peer.epoch) & Attr("beat").eq(peer.beat) & Attr("recovered").not_exists(),
            )
        except ConditionFailed:
            return False
        return True

    def suspect(self, peer: PeerBeat, now: float) -> bool:
        """Mark ``peer`` as the sweeper saw it (its beat, and ``now`` by the sweeper's clock), if
        its beat has not moved since it was read: what a later pass compares with."""
        try:
            self.table.update(
                _key(peer.worker),
                Update(set={"suspect_beat": peer.beat, "suspect_at": _time(now)}),
                condition=Attr("epoch").eq(peer.epoch) & Attr("beat").eq(peer.beat) & Attr("recovered").not_exists(),
            )
        except ConditionFailed:
            return False
        return True

    def forget(self, peer: PeerBeat) -> None:
        """Remove a recovered epoch's item once its tasks were handed on."""
        with contextlib.suppress(ConditionFailed):
            self.table.delete(_key(peer.worker), condition=Attr("epoch").eq(peer.epoch) & Attr("recovered").exists())

    def lapsed(self, worker: str, epoch: int, now: float | None = None) -> bool:
        """May a claim recorded under ``worker``'s ``epoch`` be taken over? (See the module.)"""
        item = self.table.get(_key(worker))
        if item is None:
            return True
        data = plain(item)
        if int(data["epoch"]) != epoch or data.get("recovered") is not None:
            return True
        now = time.time() if now is None else now
        return float(data.get("alive_until", 0)) + SKEW_ALLOWANCE_SECONDS < now
