"""The sweeper's backstop over worker liveness (``queueing.recovery.recover_lapsed``), with real
worker processes against moto server: it runs on another host and remembers nothing between its
passes, so its wall clock only names suspects, and a worker is dead only when its beat stood
still from one pass to a later one. A live worker whose clock is a minute behind is never
recovered; a killed one is, on the pass after the one that marked it. The sweeper's clock is
the ``now`` each pass is given, so no test waits out the allowance; every other wait is on an
observable event."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from agentq.queueing.sweeper import sweep

from tests.helpers import wait_for
from tests.test_worker_liveness import SLOW_CALL_STEP, _check_ran_once_each, _stack, _submit

STALE_AFTER = 600  # no task is silent that long here: the passes only judge liveness


def test_a_live_worker_whose_clock_is_a_minute_behind_is_never_recovered_by_the_sweeper(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    with _stack("skewsweep", ledger) as stack:
        store = stack.store()
        behind = stack.spawn_worker(AGENTQ_TEST_CLOCK_SKEW="-60")
        task = _submit(stack)
        wait_for(lambda: store.tasks.get(task.task_id).step >= SLOW_CALL_STEP, timeout=60, what="the slow call")
        (seen,) = store.tasks.workers.peers()
        assert seen.alive_until + 10 < time.time()  # by the sweeper's clock, its liveness lapsed long ago
        first = sweep(store, stack.queues(), stale_after=STALE_AFTER, now=time.time())
        (marked,) = store.tasks.workers.peers()
        assert first.recovered == [] and marked.suspect_beat is not None
        wait_for(lambda: store.tasks.workers.peers()[0].beat > (marked.suspect_beat or 0), timeout=30, what="a beat")
        # A pass a minute later by the sweeper's clock: the beat moved, so the worker lives.
        later = sweep(store, stack.queues(), stale_after=STALE_AFTER, now=time.time() + 60)
        assert later.recovered == [] and not store.tasks.workers.peers()[0].recovered
        wait_for(lambda: store.tasks.get(task.task_id).status.terminal, timeout=90, what="the task's end")
        final = _check_ran_once_each(store, task, ledger)
        assert behind.poll() is None
        assert final.claim_count == 1 and final.lease_epoch == 1  # nothing taken over, no step done twice


def test_a_killed_worker_is_recovered_by_the_sweepers_pass_after_the_one_that_marked_it(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    with _stack("deadsweep", ledger) as stack:
        store = stack.store()
        doomed = stack.spawn_worker()
        task = _submit(stack)
        wait_for(lambda: store.tasks.get(task.task_id).step >= SLOW_CALL_STEP, timeout=60, what="the slow call")
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait()
        (dead,) = store.tasks.workers.peers()
        at = dead.alive_until + 11  # the first pass whose clock sees its liveness lapsed
        assert sweep(store, stack.queues(), stale_after=STALE_AFTER, now=at).recovered == []  # a suspect only
        # Too soon: the beat stood still for less than the allowance by the sweeper's clock.
        assert sweep(store, stack.queues(), stale_after=STALE_AFTER, now=at + 5).recovered == []
        assert sweep(store, stack.queues(), stale_after=STALE_AFTER, now=at + 10).recovered == [task.task_id]
        assert store.tasks.workers.peers() == []  # its item goes once its tasks were handed on
        stack.spawn_worker()
        wait_for(lambda: store.tasks.get(task.task_id).status.terminal, timeout=90, what="the task's end")
        final = _check_ran_once_each(store, task, ledger)
        assert final.lease_epoch == 2  # taken over once, by the new worker
