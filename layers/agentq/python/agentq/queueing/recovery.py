"""A dead worker's tasks, handed on at once: who notices, and what is done.

A worker process keeps its tasks alive with one liveness item (``storage.workers``) and keeps
their queue messages invisible for long stretches (``HeartbeatHub``), so when it dies nothing
expires soon on its own: the tasks must be handed on. Every live worker's heartbeat reads the
liveness items of the few workers it watches (its successors in a ring of worker ids,
``WorkerLiveness.successors``) and ``PeerWatch`` remembers, by its own monotonic clock, when
each peer's ``beat`` last moved. A peer whose beat stood still for a liveness period is dead by
that observer's clock, whatever the two hosts' wall clocks say (clock skew cannot make a live
worker look dead, nor a dead one alive). ``recover`` then declares it dead (one conditional
write: of several observers exactly one wins, and a renewal that raced it wins over both),
lists what it held (one Query of the sparse ``owner`` index, then BatchGetItem) and makes each
task's message visible again through the receipt its claim stored on META (batches of 10): the
next receive anywhere claims the task, as a takeover of a lapsed owner. A task stays owned until
its worker lets its message go, after what follows its run (its end reported to a fan-out parent,
its callback, its dependents, its slots), so one whose run had ended is handed on too: its
redelivery does what the dead worker had not, at once rather than when the claimed message's
long visibility ran out (``held_visibility_seconds``, 10 minutes). A message that cannot
be made visible (deleted, or received again since) is replaced by a fresh one. The sweeper does
the same when no live worker is left to notice (``recover_lapsed``): its wall clock only names
suspects, and a suspect is dead when its beat stood still from one of its passes to a later one.

A recovery that dies half way leaves the peer marked and its item in place: the sweeper's
pass finishes it (``recover_lapsed`` recovers marked items too).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable

from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage
from agentq.storage.workers import SKEW_ALLOWANCE_SECONDS, PeerBeat

log = logging.getLogger("agentq.worker")


class PeerWatch:
    """What one worker saw of its peers' beats, and since when by its own clock."""

    def __init__(self, me: str, liveness_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.me = me
        self.liveness_seconds = liveness_seconds
        self.clock = clock
        self._seen: dict[str, tuple[tuple[int, int], float]] = {}

    def dead(self, peers: list[PeerBeat]) -> list[PeerBeat]:
        """The peers whose beat has not moved for a liveness period of this clock."""
        now = self.clock()
        dead = []
        present = set()
        for peer in peers:
            if peer.worker == self.me or peer.recovered:
                continue
            present.add(peer.worker)
            seen = self._seen.get(peer.worker)
            if seen is None or seen[0] != (peer.epoch, peer.beat):
                self._seen[peer.worker] = ((peer.epoch, peer.beat), now)
            elif now - seen[1] >= self.liveness_seconds:
                dead.append(peer)
        for gone in set(self._seen) - present:
            del self._seen[gone]
        return dead


def recover(store: Storage, queues: TaskQueues, peer: PeerBeat) -> list[str]:
    """Declare ``peer`` dead and hand on the tasks it held (see the module); the task ids, or
    nothing when another observer (or the peer's own renewal) won."""
    workers = store.tasks.workers
    if not peer.recovered and not workers.mark_recovered(peer):
        return []
    # Every status: a task whose run ended (or parked) before its worker died, but not what
    # came after it (its end reported to its fan-out parent, callback, dependents, slots), is
    # still owned; its message redelivered does that (the dispatcher's ended-task path).
    held = [m for m in store.tasks.owned_by(peer.worker) if int(m.get("owner_epoch", 0)) <= peer.epoch]
    by_tier: dict[str, list[dict[str, object]]] = defaultdict(list)
    for meta in held:
        by_tier[str(meta.get("owner_queue") or "normal")].append(meta)
    for tier, metas in by_tier.items():
        _make_visible(queues, tier, metas)
    workers.forget(peer)
    ids = [str(m["task_id"]) for m in held]
    log.warning("worker %s (liveness epoch %s) is dead: %d task(s) handed on", peer.worker, peer.epoch, len(ids))
    return ids


def _make_visible(queues: TaskQueues, tier: str, metas: list[dict[str, object]]) -> None:
    with_receipt = [m for m in metas if m.get("owner_message")]
    fresh = [m for m in metas if not m.get("owner_message")]
    for i in range(0, len(with_receipt), 10):
        batch = with_receipt[i : i + 10]
        try:
            resp = queues.sqs.change_message_visibility_batch(
                QueueUrl=queues.url(tier),
                Entries=[
                    {"Id": str(n), "ReceiptHandle": str(m["owner_message"]), "VisibilityTimeout": 0}
                    for n, m in enumerate(batch)
                ],
            )
            fresh += [batch[int(f["Id"])] for f in resp.get("Failed", [])]
        except Exception:
            log.exception("could not make a dead worker's messages visible on %s", tier)
            fresh += batch
    for meta in fresh:
        queues.send(str(meta["task_id"]), tier, kind="recovered", tenant=str(meta.get("tenant") or "") or None)


def recover_lapsed(store: Storage, queues: TaskQueues, now: float | None = None) -> list[str]:
    """The sweeper's pass: recover every worker whose beat stood still since an earlier pass
    marked it a suspect, or whose recovery was left half done.

    The wall clock (``alive_until`` past by more than the skew allowance) only names suspects:
    it compares the worker's clock with the sweeper's, so on its own it would take a live worker
    whose clock is behind for dead. Death is its beat not moving for the worker's liveness period
    (at least the skew allowance) by the sweeper's own clock, from one pass to a later one
    (``storage.workers``), as a peer judges it (``PeerWatch``)."""
    now = time.time() if now is None else now
    workers = store.tasks.workers
    ids: list[str] = []
    for peer in workers.peers():
        if peer.recovered:
            ids += recover(store, queues, peer)
        elif peer.alive_until + SKEW_ALLOWANCE_SECONDS < now:
            still = peer.suspect_beat == peer.beat and peer.suspect_at is not None
            if still and now - (peer.suspect_at or 0.0) >= max(SKEW_ALLOWANCE_SECONDS, peer.period):
                ids += recover(store, queues, peer)
            elif not still:
                workers.suspect(peer, now)
    return ids
