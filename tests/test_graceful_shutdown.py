"""Graceful shutdown and duplicate delivery, against moto server.

SIGTERM to a worker process: it ends its tasks at the next step boundary, keeps every
committed step, releases each lease and hands each task a message visible at once, then
exits 0 by itself; the next worker resumes every task in seconds, not after the 30 s
visibility timeout. A duplicate message for a running task starts no second execution and
is simply deleted once the task is done.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.errors import LeaseLost
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.queueing.dispatch import Action
from agentq.queueing.queues import TaskQueues
from agentq.runtime import Settings, build_queues, build_registry, build_store
from agentq.storage.container import Storage
from agentq.worker import Worker, WorkerConfig
from agentq_dev.moto_server import MotoServer

from tests.conftest import child_env
from tests.helpers import agentq_process, call, deployment, scripted, wait_for

# The worker tests run on the high tier so that they do not depend on how the slot pool shares
# a worker between tiers (tests/test_priority.py covers that).
TIER = "high"
VISIBILITY = 30  # long on purpose: a message left invisible by the shutdown would show
TURNS = 5  # tool turns of each task in the SIGTERM test, each with a charge, then the answer


def _deployment(moto_server: MotoServer) -> Settings:
    return deployment(moto_server, visibility_timeout=VISIBILITY)  # type: ignore[no-any-return]


def _wait_for(predicate: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    return wait_for(predicate, timeout, what, interval=0.05)


def _counts(queues: TaskQueues, url: str) -> dict[str, int]:
    attrs = queues.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return {
        "visible": int(attrs["ApproximateNumberOfMessages"]),
        "in_flight": int(attrs["ApproximateNumberOfMessagesNotVisible"]),
        "delayed": int(attrs["ApproximateNumberOfMessagesDelayed"]),
    }


def _task(turns: int, latency: float) -> TaskSubmission:
    script = [
        {
            "text": f"turn {i}",
            "latency_seconds": latency,
            "tool_calls": [call("lookup", query=str(i)), call("charge_card", amount_cents=i + 1, memo=str(i))],
        }
        for i in range(turns)
    ]
    script.append({"text": "finished", "latency_seconds": latency})
    return scripted(script, tools=["lookup", "charge_card"]).model_copy(update={"priority": TIER})


def _ledger_keys(ledger: Path) -> list[str]:
    return [json.loads(line)["key"] for line in ledger.read_text().splitlines()] if ledger.exists() else []


def _spawn_worker(settings: Settings, ledger: Path) -> subprocess.Popen[str]:
    return agentq_process(
        [
            "worker",
            "--concurrency",
            "8",
            "--lease",
            "3",
            "--heartbeat",
            "1",
            "--visibility",
            str(VISIBILITY),
            "--max-receive-count",
            "5",
        ],
        child_env(settings, AGENTQ_TEST_LEDGER=str(ledger)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def test_sigterm_ends_tasks_at_a_step_boundary_releases_them_and_the_next_worker_resumes_at_once(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    settings = _deployment(moto_server)
    store, queues = build_store(settings), build_queues(settings)
    ledger = tmp_path / "ledger.jsonl"
    ids = [
        submit(store, build_registry(settings), _task(turns=TURNS, latency=0.5), tenant="t", queues=queues).task_id
        for _ in range(4)
    ]

    first = _spawn_worker(settings, ledger)
    second: subprocess.Popen[str] | None = None
    try:
        _wait_for(lambda: all(store.tasks.get(t).step >= 2 for t in ids), what="every task two steps in")
        before = {t: store.steps.load(t) for t in ids}
        first.send_signal(signal.SIGTERM)
        try:  # at its tasks' next step boundary (a turn is 0.5 s); the tasks left unfinished below prove it
            _first_out, first_err = first.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker did not exit within 10 s of SIGTERM")
        assert first.returncode == 0, first_err[-3000:]
        assert "Traceback" not in first_err, first_err[-3000:]

        stopped = {t: store.tasks.get(t) for t in ids}
        unfinished = [t for t in ids if not stopped[t].status.terminal]
        assert unfinished, "every task finished before the SIGTERM took effect: nothing was tested"
        for t in ids:
            steps = store.steps.load(t)
            assert steps[: len(before[t])] == before[t]  # committed before the SIGTERM: still there, unchanged
            assert [s.number for s in steps] == list(range(1, len(steps) + 1))
            assert stopped[t].step == len(steps)  # no step left half-done
        for t in unfinished:
            task = stopped[t]
            assert task.status is TaskStatus.RUNNING
            # released, claimable now (a late heartbeat must not have extended it again)
            assert task.lease_expires == 0, f"lease of {t} held until {task.lease_expires - time.time():+.1f}s from now"
            assert task.claim_count == 1
            # the next call's reservation went back with the lease: that call never started
            assert store.budgets.get(t).reserved == 0 and task.inflight is None
        # one message per unfinished task, visible now: nothing waits out the 30 s visibility
        # (a delayed one would be a heartbeat "safety net" sent for a message deleted on purpose)
        counts = _counts(queues, queues.url(TIER))
        assert counts == {"visible": len(unfinished), "in_flight": 0, "delayed": 0}, counts

        second = _spawn_worker(settings, ledger)
        spawned = time.time()
        _wait_for(
            lambda: all(store.tasks.get(t).claim_count == 2 for t in unfinished),
            timeout=60,
            what="every unfinished task picked up again",
        )
        _wait_for(lambda: all(store.tasks.get(t).status.terminal for t in ids), timeout=60, what="all tasks done")
    finally:
        if first.poll() is None:
            _stop(first)
        _second_out, second_err = _stop(second) if second is not None else ("", "")

    assert second.returncode == 0, second_err[-3000:]
    for t in ids:
        final = store.tasks.get(t)
        assert final.status is TaskStatus.SUCCEEDED and final.result == "finished"
        assert store.budgets.get(t).reserved == 0 and final.inflight is None
        steps = store.steps.load(t)
        assert steps[: len(before[t])] == before[t]
        if t in unfinished:
            resumed_at = store.tasks.claims(final.task_id)[1].at
            assert store.tasks.claims(final.task_id)[1].worker.endswith(f":{second.pid}")
            # The start of a process on a busy machine included: well inside the 30 s visibility
            # (the proof that nothing waited for it is the queue's counts above).
            assert resumed_at - spawned < 20, f"resumed {resumed_at - spawned:.1f}s after the new worker started"
            assert [s.epoch for s in steps] == [1] * stopped[t].step + [2] * (len(steps) - stopped[t].step)
    keys = _ledger_keys(ledger)
    assert len(keys) == len(set(keys)) == TURNS * len(ids)  # every charge exactly once across the handover
    assert _counts(queues, queues.url(TIER)) == {"visible": 0, "in_flight": 0, "delayed": 0}
    assert _counts(queues, queues.dlq_url(TIER)) == {"visible": 0, "in_flight": 0, "delayed": 0}


def test_a_duplicate_message_starts_no_second_execution_and_is_deleted(
    moto_server: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    settings = _deployment(moto_server)
    store: Storage = build_store(settings)
    queues = build_queues(settings)
    worker = Worker(
        settings, WorkerConfig(concurrency=4, lease_seconds=2, heartbeat_seconds=0.5, visibility_seconds=10)
    )
    applied: list[Action] = []
    apply = worker._apply

    def recording(tier: str, message: dict[str, Any], action: Action) -> None:
        applied.append(action)
        apply(tier, message, action)

    worker._apply = recording  # type: ignore[method-assign]
    task_id = submit(store, build_registry(settings), _task(turns=7, latency=0.4), tenant="t", queues=queues).task_id
    worker.start()
    try:
        _wait_for(lambda: store.tasks.get(task_id).step >= 1, what="the task running")
        queues.send(task_id, TIER, tenant="t")  # the duplicate
        while not (task := store.tasks.get(task_id)).status.terminal:
            assert task.claim_count == 1, f"a second execution started: {store.tasks.claims(task.task_id)}"
            time.sleep(0.1)
        _wait_for(
            lambda: _counts(queues, queues.url(TIER)) == {"visible": 0, "in_flight": 0, "delayed": 0},
            what="the queue empty",
        )
    finally:
        worker.shutdown()

    final = store.tasks.get(task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.claim_count == 1 and final.lease_epoch == 1
    assert {s.epoch for s in store.steps.load(task_id)} == {1}  # nothing committed under another epoch
    assert len(_ledger_keys(ledger)) == len(set(_ledger_keys(ledger))) == 7
    ours = [a for a in applied if a.task_id == task_id]
    seen = [(a.kind, a.reason) for a in ours]
    # The duplicate came while the task ran, held by a live worker process that keeps the task's
    # own message (made visible again by a peer if that worker dies): it is deleted, untouched.
    # The two deletes race (the original's is applied after its run returns, on another thread),
    # so either may come first.
    deletes = sorted(a.reason for a in ours if a.kind == "delete")
    assert len(deletes) == 2 and deletes.count("task succeeded") == 1, seen
    assert {*deletes} - {"task succeeded"} <= {"task already succeeded", "duplicate of a message held by a live worker"}
    assert {a.kind for a in ours} <= {"delete"}
    assert _counts(queues, queues.dlq_url(TIER)) == {"visible": 0, "in_flight": 0, "delayed": 0}


def test_a_heartbeat_that_lands_after_the_release_does_not_revive_the_lease(moto_server: MotoServer) -> None:
    """The worker's heartbeat runs on its own thread: an extension sent just before a task
    released its lease (SIGTERM, time slice) can reach DynamoDB just after. It must not make
    the task look held again, or the next worker waits out a lease nobody holds."""
    settings = _deployment(moto_server)
    store = build_store(settings)
    task = store.tasks.create(_task(turns=1, latency=0), tenant="t")
    claimed = store.tasks.claim(task.task_id, "w1", 3)
    assert claimed is not None
    lease, _ = claimed
    store.tasks.release(lease)
    with contextlib.suppress(LeaseLost):  # refusing the late heartbeat is fine too
        store.tasks.extend_lease(lease, 3)
    assert store.tasks.get(task.task_id).lease_expires == 0
    assert store.tasks.claim(task.task_id, "w2", 3) is not None  # the next worker claims at once
