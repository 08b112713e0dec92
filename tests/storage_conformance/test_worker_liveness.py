"""Worker liveness (storage.workers) and claims made under it (storage.leases), on both backends:
a task whose worker is alive cannot be taken, one whose worker lapsed can, by exactly one
claimant, and the fence stays the task's lease epoch."""

from __future__ import annotations

import time

import pytest

from agentq.core.errors import LeaseLost
from agentq.core.records import ClaimOwner
from agentq.storage.container import Storage
from agentq.storage.workers import SKEW_ALLOWANCE_SECONDS, LivenessLapsed

from tests.storage_conformance._builders import new_task

TASK_LEASE = 600.0  # the backstop under a worker's liveness: never lapses in these tests


def _owned(backend: Storage, worker: str = "w1") -> tuple[str, ClaimOwner]:
    life = backend.tasks.workers.start(worker, 3)
    owner = ClaimOwner(worker, life.epoch, message="receipt-1", queue="normal")
    task_id = new_task(backend)
    assert backend.tasks.claim(task_id, worker, TASK_LEASE, owner=owner) is not None
    return task_id, owner


def test_a_claim_under_a_live_worker_records_its_owner_and_cannot_be_taken(backend: Storage) -> None:
    task_id, owner = _owned(backend)
    meta = backend.tasks.metas([task_id])[0]
    assert (meta["owner_worker"], meta["owner_epoch"], meta["owner_message"]) == ("w1", owner.epoch, "receipt-1")
    assert backend.tasks.claim(task_id, "w2", TASK_LEASE) is None
    assert [m["task_id"] for m in backend.tasks.owned_by("w1")] == [task_id]


def test_a_task_whose_worker_was_declared_dead_is_taken_once_and_the_old_epoch_is_fenced(backend: Storage) -> None:
    task_id, _ = _owned(backend)
    [peer] = backend.tasks.workers.peers()
    assert backend.tasks.workers.mark_recovered(peer) is True
    assert backend.tasks.workers.mark_recovered(peer) is False  # one observer recovers it
    got = backend.tasks.claim(task_id, "w2", TASK_LEASE)
    assert got is not None and got[0].epoch == 2
    assert backend.tasks.claim(task_id, "w3", TASK_LEASE) is None  # w2 holds a live lease now
    old = backend.tasks.claims(task_id)[0]
    with pytest.raises(LeaseLost):
        backend.tasks.release(got[0].model_copy(update={"epoch": old.epoch}))
    assert "owner_worker" not in backend.tasks.metas([task_id])[0]  # a per-task lease: no owner


def test_a_declared_dead_worker_cannot_renew_and_a_new_epoch_makes_its_old_claims_claimable(backend: Storage) -> None:
    workers = backend.tasks.workers
    life = workers.start("w1", 3)
    life = workers.renew(life, 3)
    [peer] = workers.peers()
    assert peer.beat == 1
    assert workers.mark_recovered(peer)
    with pytest.raises(LivenessLapsed):
        workers.renew(life, 3)
    newer = workers.start("w1", 3)
    assert newer.epoch != life.epoch
    assert workers.lapsed("w1", life.epoch) is True and workers.lapsed("w1", newer.epoch) is False


def test_a_renewal_between_the_read_and_the_mark_wins_over_the_observer(backend: Storage) -> None:
    workers = backend.tasks.workers
    life = workers.start("w1", 3)
    [seen] = workers.peers()
    workers.renew(life, 3)  # the worker was alive after all
    assert workers.mark_recovered(seen) is False
    assert workers.lapsed("w1", life.epoch) is False


def test_a_worker_that_re_adopts_before_the_claimant_keeps_its_task(backend: Storage) -> None:
    task_id, _ = _owned(backend)
    [peer] = backend.tasks.workers.peers()
    backend.tasks.workers.mark_recovered(peer)
    newer = backend.tasks.workers.start("w1", 3)
    lease = backend.tasks.claims(task_id)[-1]
    from agentq.core.models import Lease

    held = Lease(task_id=task_id, owner="w1", epoch=lease.epoch, expires_at=time.time() + TASK_LEASE)
    assert backend.tasks.adopt(held, ClaimOwner("w1", newer.epoch)) is True
    assert backend.tasks.claim(task_id, "w2", TASK_LEASE) is None  # its owner's epoch is live again


def test_wall_clock_lapse_needs_the_skew_allowance_on_top(backend: Storage) -> None:
    workers = backend.tasks.workers
    life = workers.start("w1", 3)
    assert workers.lapsed("w1", life.epoch, now=life.alive_until + 1) is False  # a skewed clock
    assert workers.lapsed("w1", life.epoch, now=life.alive_until + SKEW_ALLOWANCE_SECONDS + 1) is True


def test_a_disowned_task_leaves_its_workers_index(backend: Storage) -> None:
    task_id, _ = _owned(backend)
    claim = backend.tasks.claims(task_id)[-1]
    from agentq.core.models import Lease

    backend.tasks.disown(Lease(task_id=task_id, owner="w1", epoch=claim.epoch, expires_at=time.time() + 60))
    assert backend.tasks.owned_by("w1") == []


def test_a_worker_watches_its_successors_in_a_ring_of_worker_ids_whatever_the_fleet(backend: Storage) -> None:
    """Each worker reads a bounded window of peers (its successors, wrapping around), so its
    reads do not grow with the fleet and every worker is watched by as many predecessors."""
    workers = backend.tasks.workers
    for name in ("w1", "w2", "w3", "w4", "w5"):
        workers.start(name, 3)

    def watched(me: str) -> list[str]:
        return [p.worker for p in workers.successors(me, 2).peers]

    assert watched("w1") == ["w2", "w3"]
    assert watched("w4") == ["w5", "w1"]  # the ring goes on from the first
    assert watched("w5") == ["w1", "w2"]
    assert sorted(w for me in ("w1", "w2", "w3", "w4", "w5") for w in watched(me)) == sorted(
        ["w1", "w2", "w3", "w4", "w5"] * 2
    )  # every worker watched by two
    window = workers.successors("w2", 2)
    assert window.queries == 1 and window.items == 3  # itself and two: one Query, whatever the fleet
    workers.start("w0", 3)  # a newcomer between the last and the first
    assert watched("w5") == ["w0", "w1"]


def test_a_lone_worker_watches_nobody_and_a_pair_watch_each_other(backend: Storage) -> None:
    workers = backend.tasks.workers
    workers.start("a", 3)
    assert workers.successors("a", 2).peers == []
    workers.start("b", 3)
    assert [p.worker for p in workers.successors("a", 2).peers] == ["b"]
    first = workers.successors("b", 2)
    assert [p.worker for p in first.peers] == ["a"] and first.whole and first.queries == 2
    again = workers.successors("b", 2, small=True)  # it saw the whole fleet: one Query of the partition
    assert [p.worker for p in again.peers] == ["a"] and again.whole and again.queries == 1


def test_a_small_fleet_that_grows_is_watched_as_a_ring_again(backend: Storage) -> None:
    workers = backend.tasks.workers
    for name in ("a", "b", "c", "d", "e"):
        workers.start(name, 3)
    grown = workers.successors("b", 2, small=True)  # the fleet grew past what one small Query reads
    assert [p.worker for p in grown.peers] == ["c", "d"] and not grown.whole
    assert [p.worker for p in workers.successors("e", 2, small=True).peers] == ["a", "b"]
