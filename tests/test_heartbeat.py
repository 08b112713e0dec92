"""The worker's heartbeat hub: rounds at a fixed rate, one liveness write per process per
round whatever it holds, no per-task write for a task that waits, the backstop leases closest
to expiry first, visibility batches in parallel, received messages kept invisible before their
claim, live text only when it changed, and lease-loss detection after a lapse.

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
from agentq.core.records import ClaimOwner
from agentq.core.reservation import Seen
from agentq.storage.workers import LivenessLapsed, Watched, WorkerLife
from agentq.worker import HeartbeatHub, WorkerConfig


class FakeWorkers:
    """The liveness item: ``renew`` takes ``delay`` seconds, records when it began, and fails
    as told (``lapsed``: declared dead; ``failing``: the write does not reach the table)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.renewals: list[float] = []
        self.starts = 0
        self.lapsed = False
        self.failing = False
        self.watches: list[float] = []
        self.watch_delay = 0.0  # reading the peers (or recovering a dead one's tasks) takes this long

    def start(self, worker: str, seconds: float) -> WorkerLife:
        self.starts += 1
        self.lapsed = False
        return WorkerLife(worker, self.starts, 0, time.time() + seconds)

    def renew(self, life: WorkerLife, seconds: float) -> WorkerLife:
        self.renewals.append(time.monotonic())
        time.sleep(self.delay)
        if self.failing:
            raise ConnectionError("unreachable")
        if self.lapsed:
            raise LivenessLapsed("declared dead")
        return WorkerLife(life.worker, life.epoch, life.beat + 1, time.time() + seconds)

    def peers(self) -> list[Any]:
        return []

    def successors(self, me: str, small: bool = False) -> Watched:
        self.watches.append(time.monotonic())
        time.sleep(self.watch_delay)
        return Watched([], queries=1, items=1)

    def stop(self, life: WorkerLife) -> None:
        pass


class SlowStore:
    """``extend_lease`` that takes ``delay`` seconds and records when each call began."""

    def __init__(self, delay: float = 0.0, renew_delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[tuple[float, str]] = []
        self.published: list[tuple[str, str | None]] = []
        self.seen: list[tuple[str, Seen | None]] = []
        self.workers = FakeWorkers(renew_delay)
        self.meta: dict[str, dict[str, Any]] = {}  # what a recheck reads
        self.adopted: list[tuple[str, int]] = []
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

    def publish_live_text(self, lease: Lease, text: str | None, seen: Seen | None = None) -> None:
        self.published.append((lease.task_id, text))
        self.seen.append((lease.task_id, seen))

    def disown(self, lease: Lease) -> None:
        pass

    def metas(self, task_ids: list[str]) -> list[dict[str, Any]]:
        return [self.meta[t] for t in task_ids if t in self.meta]

    def adopt(self, lease: Lease, owner: ClaimOwner) -> bool:
        self.adopted.append((lease.task_id, owner.epoch))
        return True


class SlowSqs:
    def __init__(self, delay: float, together: threading.Barrier | None = None) -> None:
        self.delay = delay
        self.batches: list[list[str]] = []
        self.together = together  # each call waits here until that many are in flight at once
        self.met: list[bool] = []

    def change_message_visibility_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.batches.append([e["ReceiptHandle"] for e in Entries])
        if self.together is not None:
            try:
                self.together.wait(timeout=30)  # released only when the last of them arrives
                self.met.append(True)
            except threading.BrokenBarrierError:
                self.met.append(False)
        time.sleep(self.delay)
        return {"Successful": [{"Id": e["Id"]} for e in Entries]}


class FakeQueues:
    def __init__(self, sqs: SlowSqs) -> None:
        self.sqs = sqs

    def url(self, tier: str) -> str:
        return f"queue-{tier}"


def _session(task_id: str, expires_in: float = 600.0) -> LeaseState:
    lease = Lease(task_id=task_id, owner="w", epoch=1, expires_at=time.time() + expires_in)
    return LeaseState(lease=lease)


def _hub(store: SlowStore, sqs: SlowSqs | None = None, **config: Any) -> HeartbeatHub:
    return HeartbeatHub(store, FakeQueues(sqs or SlowSqs(0)), WorkerConfig(**config), "w")  # type: ignore[arg-type]


def _holding(hub: HeartbeatHub, stack: ExitStack, sessions: list[LeaseState], tier: str = "normal") -> None:
    for i, session in enumerate(sessions):
        held = stack.enter_context(hub.hold(tier, f"receipt-{i}"))
        stack.enter_context(hub.track(held, session))


# The liveness period of the tests below: long enough that no stall of a loaded machine between
# two lines of a test passes it (a 50 ms period did, at load 38); its passing is simulated.
LIVENESS = 30.0


def _liveness_passes(hub: HeartbeatHub) -> None:
    """As if the hub's last successful renewal were one liveness period and a bit ago."""
    hub._renewed_at -= LIVENESS + 0.1


def _beat(hub: HeartbeatHub) -> None:
    hub.beat([(h, h.lease_state) for h in hub._held])


def test_rounds_start_a_heartbeat_apart_even_when_each_round_takes_most_of_it() -> None:
    """A liveness write that takes 0.3 s, a heartbeat of 0.6 s: a hub that waited a heartbeat
    after each round would start them 0.9 s apart. (Half the heartbeat to spare: a busy machine
    wakes a sleep late, and a round past its heartbeat is an overrun.)"""
    store = SlowStore(renew_delay=0.3)
    hub = _hub(store, heartbeat_seconds=0.6, lease_seconds=3, beat_threads=1)
    with ExitStack() as stack:
        _holding(hub, stack, [_session("t1")])
        hub.start()
        time.sleep(4.0)  # 6 rounds at a fixed rate (a second to spare for late wake-ups), 4 at a fixed delay
        hub.stop()
    starts = store.workers.renewals
    gaps = [b - a for a, b in pairwise(starts)]
    assert len(starts) >= 5, starts
    assert statistics.median(gaps) < 0.75, f"rounds {gaps} apart: fixed delay, not fixed rate"
    assert hub.counts["overruns"] == 0


def test_a_slow_watch_of_the_peers_never_delays_the_renewal() -> None:
    """Reading the peers (or handing on a dead peer's tasks) takes 1.2 s, three heartbeats:
    the renewals still go out a heartbeat apart, and no second watch starts beside the first."""
    store = SlowStore()
    store.workers.watch_delay = 1.2
    hub = _hub(store, heartbeat_seconds=0.4, lease_seconds=3, beat_threads=2)
    hub.start()
    time.sleep(3.0)
    hub.stop()
    gaps = [b - a for a, b in pairwise(store.workers.renewals)]
    assert len(gaps) >= 5 and statistics.median(gaps) < 0.5, f"renewals {gaps} apart"
    watch_gaps = [b - a for a, b in pairwise(store.workers.watches)]
    assert watch_gaps and min(watch_gaps) >= 1.2, f"watches {watch_gaps} apart: one began before the last ended"


def test_a_round_longer_than_the_heartbeat_is_followed_at_once_without_catch_up_rounds() -> None:
    store = SlowStore(renew_delay=0.6)
    hub = _hub(store, heartbeat_seconds=0.4, lease_seconds=3, beat_threads=1)
    with ExitStack() as stack:
        _holding(hub, stack, [_session("t1")])
        hub.start()
        time.sleep(2.6)
        hub.stop()
    starts = store.workers.renewals
    gaps = [b - a for a, b in pairwise(starts)]
    assert len(starts) >= 3, starts
    assert min(gaps) > 0.55, f"rounds {gaps} apart: catch-up rounds after an overrun"
    assert statistics.median(gaps) < 0.9, f"rounds {gaps} apart: a wait after each overrun (fixed delay gives 1.0)"
    assert hub.counts["overruns"] >= 2


def test_backstop_leases_closest_to_expiry_are_extended_first() -> None:
    store = SlowStore(delay=0)
    hub = _hub(store, beat_threads=1, task_lease_seconds=10)
    expiries = {"t-late": 4.9, "t-soon": 0.4, "t-mid": 1.5, "t-sooner": 0.2, "t-later": 2.5}
    with ExitStack() as stack:
        _holding(hub, stack, [_session(t, expires_in=e) for t, e in expiries.items()])
        hub.beat([(h, h.lease_state) for h in hub._held])
    assert [t for _, t in store.calls] == sorted(expiries, key=expiries.__getitem__)


def test_visibility_batches_of_one_round_go_out_together_not_one_after_another() -> None:
    """40 messages = 4 batches of 10, each call held until all four are in flight: in series the
    first would wait alone and the barrier break, whatever the machine's speed."""
    sqs = SlowSqs(delay=0, together=threading.Barrier(4))
    hub = _hub(SlowStore(delay=0), sqs, beat_threads=4)
    with ExitStack() as stack:
        _holding(hub, stack, [_session(f"t{i}") for i in range(40)])
        hub.beat([(h, h.lease_state) for h in hub._held])
    assert sorted(len(b) for b in sqs.batches) == [10, 10, 10, 10]
    assert sqs.met == [True] * 4, "the round's visibility batches did not all go out at once"


def test_a_received_message_is_kept_invisible_before_its_task_is_claimed() -> None:
    """Under load the reads before a claim can outlast the visibility set at receive."""
    sqs = SlowSqs(delay=0)
    store = SlowStore(delay=0)
    hub = _hub(store, sqs)
    with hub.hold("normal", "receipt-unclaimed"):
        hub.beat([(h, h.lease_state) for h in hub._held])
    assert sqs.batches == [["receipt-unclaimed"]]
    assert store.calls == []  # no lease to extend yet


def test_a_backstop_lease_is_written_only_when_half_of_it_is_left() -> None:
    store = SlowStore(delay=0)
    hub = _hub(store, task_lease_seconds=600)
    with ExitStack() as stack:
        _holding(hub, stack, [_session("t-fresh", expires_in=590), _session("t-half", expires_in=290)])
        _beat(hub)
    assert [t for _, t in store.calls] == ["t-half"]


def test_a_backstop_lease_whose_commit_is_on_the_wire_is_left_to_the_commit() -> None:
    """The commit renews the lease (or ends the task): an extension racing it is wasted."""
    store = SlowStore(delay=0)
    hub = _hub(store, task_lease_seconds=600)
    committing, stuck = _session("t-committing", expires_in=200), _session("t-stuck", expires_in=200)
    committing.commit_sent_at = time.time()
    stuck.commit_sent_at = time.time() - 400
    with ExitStack() as stack:
        _holding(hub, stack, [committing, stuck])
        _beat(hub)
    assert [t for _, t in store.calls] == ["t-stuck"]


def test_tasks_waiting_on_their_calls_cost_no_write_and_no_queue_call_after_the_first_round() -> None:
    """200 held tasks: one round sets their messages' long visibility (20 batches), and the
    rounds after it touch neither their leases nor their messages: one liveness write each."""
    sqs, store = SlowSqs(delay=0), SlowStore(delay=0)
    hub = _hub(store, sqs, beat_threads=4)
    hub.life = store.workers.start("w", 3)
    with ExitStack() as stack:
        _holding(hub, stack, [_session(f"t{i}") for i in range(200)])
        _beat(hub)
        assert len(sqs.batches) == 20
        for _ in range(10):
            hub.renew()
            _beat(hub)
    assert len(sqs.batches) == 20 and store.calls == [] and store.published == []
    assert len(store.workers.renewals) == 10
    assert hub.demand() < 0.1  # admission sees a held task needs almost no writes


def test_live_text_is_written_only_when_it_changed() -> None:
    store = SlowStore(delay=0)
    hub = _hub(store)
    streaming, quiet = _session("t-streaming"), _session("t-quiet")
    with ExitStack() as stack:
        _holding(hub, stack, [streaming, quiet])
        streaming.live_text = "Hello"
        _beat(hub)
        _beat(hub)  # unchanged: nothing written
        streaming.live_text = "Hello, world"
        _beat(hub)
        told = Seen(epoch=1, step=1, until=None, tokens_in=40)  # the stream's first event: its input
        streaming.seen = told
        _beat(hub)  # the text is unchanged, what the call billed so far is new: written
        _beat(hub)
    assert store.published == [
        ("t-streaming", "Hello"),
        ("t-streaming", "Hello, world"),
        ("t-streaming", "Hello, world"),
    ]
    assert store.seen == [("t-streaming", None), ("t-streaming", None), ("t-streaming", told)]


def test_a_worker_declared_dead_starts_a_new_epoch_re_adopts_its_own_tasks_and_drops_the_taken_ones() -> None:
    store = SlowStore(delay=0)
    hub = _hub(store)
    mine, taken = _session("t-mine"), _session("t-taken")
    store.meta = {
        "t-mine": {"task_id": "t-mine", "lease_epoch": 1, "status": "running"},
        "t-taken": {"task_id": "t-taken", "lease_epoch": 2, "status": "running"},  # a peer claimed it
    }
    hub.life = store.workers.start("w", 3)
    with ExitStack() as stack:
        _holding(hub, stack, [mine, taken])
        store.workers.lapsed = True
        hub.renew()
    assert store.workers.starts == 2 and hub.life.epoch == 2
    assert store.adopted == [("t-mine", 2)]
    assert taken.lost.is_set() and not mine.lost.is_set()


def test_a_worker_whose_liveness_writes_fail_past_its_liveness_drops_the_tasks_taken_over() -> None:
    store = SlowStore(delay=0)
    hub = _hub(store, lease_seconds=LIVENESS)
    mine, taken = _session("t-mine"), _session("t-taken")
    store.meta = {
        "t-mine": {"task_id": "t-mine", "lease_epoch": 1, "status": "running"},
        "t-taken": {"task_id": "t-taken", "lease_epoch": 2, "status": "running"},
    }
    hub.life = store.workers.start("w", LIVENESS)
    with ExitStack() as stack:
        _holding(hub, stack, [mine, taken])
        store.workers.failing = True
        hub.renew()  # within its liveness: nothing to suspect yet
        assert not taken.lost.is_set()
        _liveness_passes(hub)
        hub.renew()
    assert taken.lost.is_set() and not mine.lost.is_set()
    assert store.adopted == []  # it cannot know its epoch was declared dead: nothing re-adopted


def test_a_worker_whose_liveness_is_not_renewed_within_its_period_is_not_alive_to_take_tasks() -> None:
    store = SlowStore(delay=0)
    hub = _hub(store, lease_seconds=LIVENESS)
    assert not hub.alive()  # not started: no liveness yet
    hub.life = store.workers.start("w", LIVENESS)
    hub.renew()
    assert hub.alive()
    store.workers.failing = True
    _liveness_passes(hub)
    hub.renew()
    assert not hub.alive()  # its pollers take nothing new while this lasts
    store.workers.failing = False
    hub.renew()
    assert hub.alive()
