"""Liveness per worker process (storage.workers, queueing.recovery) with real worker processes
against moto server: a worker paused past its liveness loses its task to a peer and commits
nothing after it wakes; a worker whose liveness writes fail while its task writes succeed hands
its task on; workers whose clocks are seconds apart take nothing from each other, and still
resume a killed one's task within seconds. Every wait is on an observable event."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from agentq.control.submit import submit
from agentq.core.models import Task, TaskStatus
from agentq.runtime import build_registry
from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests.helpers import call, scripted, wait_for


def _turn(i: int, latency: float) -> dict[str, object]:
    return {
        "text": f"turn {i}",
        "latency_seconds": latency,
        "tool_calls": [call("lookup", query=str(i)), call("charge_card", amount_cents=i + 1, memo=str(i))],
    }


# Four quick turns (8 steps), then a model call of 15 s during which the worker is paused, cut
# off or killed (a task waiting on a model call: what liveness per worker makes free), then more.
# The call outlasts what the tests do inside it (a takeover, or four beats of each worker and a
# kill) with room for a loaded machine: a call that ended first would let the task end unmoved.
SLOW_CALL_STEP = 8
TURNS = [_turn(i, 0.2) for i in range(4)] + [_turn(4, 15.0)] + [_turn(i, 0.2) for i in range(5, 8)]
TURNS.append({"text": "finished"})


def _stack(prefix: str, ledger: Path) -> LocalStack:
    path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    return LocalStack(
        prefix=prefix, workers=0, api=False, sweep_every=None,
        tool_modules=("tests.effect_tools", "tests.liveness_faults"),
        extra_env={"AGENTQ_TEST_LEDGER": str(ledger), "PYTHONPATH": path},
    )  # fmt: skip


def _submit(stack: LocalStack) -> Task:
    assert stack.settings is not None
    registry = build_registry(stack.settings)
    return submit(stack.store(), registry, scripted(TURNS, tools=["lookup", "charge_card"]), tenant="t",
                  queues=stack.queues())  # fmt: skip


def _pid_of(worker: str) -> int:
    return int(worker.rsplit(":", 1)[1])


def _check_ran_once_each(store: Storage, task: Task, ledger: Path) -> Task:
    final = store.tasks.get(task.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "finished"
    steps = store.steps.load(task.task_id)
    assert [s.number for s in steps] == list(range(1, len(steps) + 1))
    keys = [json.loads(line)["key"] for line in ledger.read_text().splitlines()]
    assert len(keys) == len(set(keys))  # no side effect twice
    return final


def test_a_worker_paused_past_its_liveness_loses_its_task_to_a_peer_and_commits_nothing_after_waking(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    with _stack("pause", ledger) as stack:
        store = stack.store()
        first = stack.spawn_worker()
        task = _submit(stack)
        # The peer starts once the first worker holds the task: a slow start must not hand it over.
        wait_for(lambda: store.tasks.get(task.task_id).lease_owner, timeout=60, what="the first claim")
        peer = stack.spawn_worker()
        wait_for(lambda: store.tasks.get(task.task_id).step >= SLOW_CALL_STEP, timeout=60, what="the slow call")
        os.kill(first.pid, signal.SIGSTOP)
        try:
            frozen = store.tasks.get(task.task_id)
            assert _pid_of(frozen.lease_owner or "") == first.pid
            taken = wait_for(
                lambda: (t := store.tasks.get(task.task_id)).lease_epoch >= 2 and t, timeout=60, what="a takeover"
            )
        finally:
            os.kill(first.pid, signal.SIGCONT)
        wait_for(lambda: store.tasks.get(task.task_id).status.terminal, timeout=90, what="the task's end")
        final = _check_ran_once_each(store, task, ledger)
        assert _pid_of(taken.lease_owner or "") == peer.pid and final.lease_epoch == 2
        steps = store.steps.load(task.task_id)
        assert all(s.epoch == 2 for s in steps[taken.step :])  # nothing of the woken worker's after
        assert first.poll() is None  # woken, it lives on (a new liveness epoch), it just lost the task


def test_a_worker_whose_liveness_writes_fail_while_its_task_writes_succeed_hands_its_task_on(
    tmp_path: Path,
) -> None:
    ledger, failing = tmp_path / "ledger.jsonl", tmp_path / "liveness-fails"
    with _stack("cutoff", ledger) as stack:
        store = stack.store()
        sick = stack.spawn_worker(AGENTQ_TEST_LIVENESS_FAILS_WHILE=str(failing))
        task = _submit(stack)
        # The healthy worker starts once the sick one holds the task: a slow start must not hand it over.
        wait_for(lambda: store.tasks.get(task.task_id).lease_owner, timeout=60, what="the first claim")
        healthy = stack.spawn_worker()
        wait_for(lambda: store.tasks.get(task.task_id).step >= SLOW_CALL_STEP, timeout=60, what="the slow call")
        assert _pid_of(store.tasks.get(task.task_id).lease_owner or "") == sick.pid
        failing.touch()  # from now on its liveness writes fail; its task writes still land
        taken = wait_for(
            lambda: (t := store.tasks.get(task.task_id)).lease_epoch >= 2 and t, timeout=60, what="a takeover"
        )
        wait_for(lambda: store.tasks.get(task.task_id).status.terminal, timeout=90, what="the task's end")
        final = _check_ran_once_each(store, task, ledger)
        assert _pid_of(taken.lease_owner or "") == healthy.pid and final.lease_epoch == 2
        assert sick.poll() is None


def test_workers_with_clocks_seconds_apart_take_nothing_from_each_other_and_resume_a_killed_ones_task(
    tmp_path: Path,
) -> None:
    """One worker's clock 6 s behind, the other's 6 s ahead: death is judged by each observer's
    own clock (a beat that stopped moving), so the 12 s between them takes nothing over."""
    ledger = tmp_path / "ledger.jsonl"
    with _stack("skew", ledger) as stack:
        store = stack.store()
        behind = stack.spawn_worker(AGENTQ_TEST_CLOCK_SKEW="-6")
        task = _submit(stack)
        # The second worker starts once the first holds the task: a slow start must not hand it over.
        wait_for(lambda: store.tasks.get(task.task_id).lease_owner, timeout=60, what="the first claim")
        ahead = stack.spawn_worker(AGENTQ_TEST_CLOCK_SKEW="6")
        wait_for(lambda: store.tasks.get(task.task_id).step >= SLOW_CALL_STEP, timeout=60, what="the slow call")
        wait_for(lambda: len(store.tasks.workers.peers()) == 2, timeout=30, what="both workers beating")
        watched = {p.worker: p.beat for p in store.tasks.workers.peers()}
        # Both beat on for more than a liveness period (3 s) while the call waits: no takeover.
        wait_for(
            lambda: all(p.beat >= watched.get(p.worker, 0) + 4 for p in store.tasks.workers.peers())
            and len(watched) == 2,
            timeout=30, what="four more beats of each worker",
        )  # fmt: skip
        held = store.tasks.get(task.task_id)
        assert held.claim_count == 1 and _pid_of(held.lease_owner or "") == behind.pid
        os.kill(behind.pid, signal.SIGKILL)
        killed_at = time.time()
        wait_for(lambda: store.tasks.get(task.task_id).status.terminal, timeout=90, what="the task's end")
        final = _check_ran_once_each(store, task, ledger)
        claims = store.tasks.claims(task.task_id)
        assert final.claim_count == 2 and _pid_of(claims[1].worker) == ahead.pid
        gap = claims[1].at - 6 - killed_at  # the claim's time is the ahead worker's clock
        assert gap < 20, f"resumed {gap:.1f}s after the kill"  # seconds, not the 600 s of a held message
