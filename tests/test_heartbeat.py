"""The worker's heartbeat hub: rounds at a fixed rate, the leases closest to expiry first,
visibility batches in parallel, received messages kept invisible before their claim, and no
write for a lease that progress renewed since the last round.

Against fake clients whose calls take a set time, so the timing of rounds is what the hub
does, not what moto happens to do."""

from __future__ import annotations

import statistics
import threading
import time
from contextlib import ExitStack
from itertools import pairwise
from typing import Any

from agentq.core.engine import LeaseState
from agentq.core.models import Lease
from agentq.queueing.worker import HeartbeatHub, WorkerConfig


class SlowStore:
    """``extend_lease`` that takes ``delay`` seconds and records when each call began."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    @property
    def tasks(self) -> SlowStore:
        """The hub reaches the lease through ``storage.tasks``: this fake is its own repository."""
        return self

    def extend_lease(self, lease: Lease, lease_seconds: float, *, live_text: str | None = None) -> Lease:
        expires = time.time() + lease_seconds  # as the real store: from when the write is sent
        with self._lock:
            self.calls.append((time.monotonic(), lease.task_id))
        time.sleep(self.delay)
        return lease.model_copy(update={"expires_at": expires})


class SlowSqs:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.batches: list[list[str]] = []

    def change_message_visibility_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.batches.append([e["ReceiptHandle"] for e in Entries])
        time.sleep(self.delay)
        return {"Successful": [{"Id": e["Id"]} for e in Entries]}


class FakeQueues:
    def __init__(self, sqs: SlowSqs) -> None:
        self.sqs = sqs

    def url(self, tier: str) -> str:
        return f"queue-{tier}"


def _session(task_id: str, expires_in: float = 3.0) -> LeaseState:
    lease = Lease(task_id=task_id, owner="w", epoch=1, expires_at=time.time() + expires_in)
    return LeaseState(lease=lease)


def _hub(store: SlowStore, sqs: SlowSqs | None = None, **config: Any) -> HeartbeatHub:
    return HeartbeatHub(store, FakeQueues(sqs or SlowSqs(0)), WorkerConfig(**config))  # type: ignore[arg-type]


def _holding(hub: HeartbeatHub, stack: ExitStack, sessions: list[LeaseState], tier: str = "normal") -> None:
    for i, session in enumerate(sessions):
        held = stack.enter_context(hub.hold(tier, f"receipt-{i}"))
        stack.enter_context(hub.track(held, session))


def _round_starts(store: SlowStore) -> list[float]:
    return [at for at, _ in store.calls]


def test_rounds_start_a_heartbeat_apart_even_when_each_round_takes_most_of_it() -> None:
    """One task, a lease write that takes 0.25 s, a heartbeat of 0.4 s: a hub that waited a
    heartbeat after each round would start them 0.65 s apart."""
    store = SlowStore(delay=0.25)
    hub = _hub(store, heartbeat_seconds=0.4, lease_seconds=3, beat_threads=1)
    with ExitStack() as stack:
        _holding(hub, stack, [_session("t1")])
        hub.start()
        time.sleep(2.5)
        hub.stop()
    starts = _round_starts(store)
    gaps = [b - a for a, b in pairwise(starts)]
    assert len(starts) >= 5, starts
    assert statistics.median(gaps) < 0.5, f"rounds {gaps} apart: fixed delay, not fixed rate"
    assert hub.counts["overruns"] == 0


def test_a_round_longer_than_the_heartbeat_is_followed_at_once_without_catch_up_rounds() -> None:
    store = SlowStore(delay=0.6)
    hub = _hub(store, heartbeat_seconds=0.4, lease_seconds=3, beat_threads=1)
    with ExitStack() as stack:
        _holding(hub, stack, [_session("t1")])
        hub.start()
        time.sleep(2.6)
        hub.stop()
    starts = _round_starts(store)
    gaps = [b - a for a, b in pairwise(starts)]
    assert len(starts) >= 3, starts
    assert min(gaps) > 0.55, f"rounds {gaps} apart: catch-up rounds after an overrun"
    assert statistics.median(gaps) < 0.9, f"rounds {gaps} apart: a wait after each overrun (fixed delay gives 1.0)"
    assert hub.counts["overruns"] >= 2


def test_leases_closest_to_expiry_are_extended_first() -> None:
    store = SlowStore(delay=0)
    hub = _hub(store, beat_threads=1, lease_seconds=10)
    expiries = {"t-late": 2.9, "t-soon": 0.4, "t-mid": 1.5, "t-sooner": 0.2, "t-later": 2.5}
    with ExitStack() as stack:
        _holding(hub, stack, [_session(t, expires_in=e) for t, e in expiries.items()])
        hub.beat([(h, h.lease_state) for h in hub._held])
    assert [t for _, t in store.calls] == sorted(expiries, key=expiries.__getitem__)


def test_visibility_batches_of_one_round_go_out_together_not_one_after_another() -> None:
    """40 messages = 4 batches of 10, each call 0.3 s: in series a round would take 1.2 s."""
    sqs = SlowSqs(delay=0.3)
    hub = _hub(SlowStore(delay=0), sqs, beat_threads=4)
    with ExitStack() as stack:
        _holding(hub, stack, [_session(f"t{i}") for i in range(40)])
        began = time.monotonic()
        hub.beat([(h, h.lease_state) for h in hub._held])
        took = time.monotonic() - began
    assert sorted(len(b) for b in sqs.batches) == [10, 10, 10, 10]
    assert took < 0.6, f"a round of 4 visibility batches took {took:.2f}s"


def test_a_received_message_is_kept_invisible_before_its_task_is_claimed() -> None:
    """Under load the reads before a claim can outlast the visibility set at receive."""
    sqs = SlowSqs(delay=0)
    store = SlowStore(delay=0)
    hub = _hub(store, sqs)
    with hub.hold("normal", "receipt-unclaimed"):
        hub.beat([(h, h.lease_state) for h in hub._held])
    assert sqs.batches == [["receipt-unclaimed"]]
    assert store.calls == []  # no lease to extend yet


def test_a_lease_renewed_since_the_last_round_is_not_written_again_but_one_a_heartbeat_old_is() -> None:
    store = SlowStore(delay=0)
    hub = _hub(store, lease_seconds=3, heartbeat_seconds=1)
    with ExitStack() as stack:
        # just committed (the commit moved the lease a full lease ahead) / extended by the last round
        _holding(hub, stack, [_session("t-committed", expires_in=2.9), _session("t-last-round", expires_in=2.0)])
        hub.beat([(h, h.lease_state) for h in hub._held])
    assert [t for _, t in store.calls] == ["t-last-round"]
    assert hub.counts["skipped_fresh"] == 1


def test_a_lease_whose_commit_is_on_the_wire_is_left_to_the_commit_unless_it_has_been_there_long() -> None:
    """The commit renews the lease (or ends the task): an extension racing it is wasted."""
    store = SlowStore(delay=0)
    hub = _hub(store, lease_seconds=3, heartbeat_seconds=1)
    committing, stuck = _session("t-committing", expires_in=1.5), _session("t-stuck", expires_in=1.5)
    committing.commit_sent_at = time.time()
    stuck.commit_sent_at = time.time() - 0.8
    with ExitStack() as stack:
        _holding(hub, stack, [committing, stuck])
        hub.beat([(h, h.lease_state) for h in hub._held])
    assert [t for _, t in store.calls] == ["t-stuck"]
