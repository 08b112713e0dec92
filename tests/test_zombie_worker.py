"""Invariant 2 with real processes: a worker paused (SIGSTOP) past its lease, superseded by
another worker, then woken (SIGCONT), can commit nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentq.core.models import TaskStatus
from agentq.runtime import Settings
from agentq.storage.container import Storage

from tests.conftest import child_env
from tests.helpers import call, scripted

TURNS = [
    {
        "text": f"turn {i}",
        "latency_seconds": 0.4,
        "tool_calls": [call("lookup", query=str(i)), call("charge_card", amount_cents=i, memo=str(i))],
    }
    for i in range(6)
] + [{"text": "done", "latency_seconds": 0.4}]


def _spawn(settings: Settings, task_id: str, ledger: Path, wait: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentq", "run-task", task_id, "--lease", "1", "--wait", str(wait)],
        env=child_env(settings, AGENTQ_TEST_LEDGER=str(ledger)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_a_paused_worker_woken_after_takeover_commits_nothing(
    settings: Settings, store: Storage, tmp_path: Path
) -> None:
    task = store.tasks.create(scripted(TURNS, tools=["lookup", "charge_card"]), tenant="t")
    ledger = tmp_path / "ledger.jsonl"
    zombie = _spawn(settings, task.task_id, ledger, wait=0)
    _wait_for(lambda: store.tasks.get(task.task_id).step >= 3)
    os.kill(zombie.pid, signal.SIGSTOP)
    try:
        time.sleep(1.5)  # the zombie's lease (1 s) lapses; anything it had on the wire has landed
        frozen_at = store.tasks.get(task.task_id).step
        successor = _spawn(settings, task.task_id, ledger, wait=10)
        _wait_for(
            lambda: store.tasks.get(task.task_id).lease_epoch == 2 and store.tasks.get(task.task_id).step > frozen_at
        )
    finally:
        os.kill(zombie.pid, signal.SIGCONT)  # wake it while the successor is still mid-task
    z_out, z_err = zombie.communicate(timeout=60)
    s_out, s_err = successor.communicate(timeout=60)

    zombie_report = json.loads(z_out.strip().splitlines()[-1])
    assert zombie_report["outcome"] == "lease_lost", z_err[-2000:]
    assert json.loads(s_out.strip().splitlines()[-1])["status"] == "succeeded", s_err[-2000:]

    steps = store.steps.load(task.task_id)
    assert [s.number for s in steps] == list(range(1, len(steps) + 1))
    assert all(s.epoch == 1 for s in steps[:frozen_at])
    assert all(s.epoch == 2 for s in steps[frozen_at:])  # nothing of the zombie's after the takeover
    keys = [json.loads(line)["key"] for line in ledger.read_text().splitlines()]
    assert len(keys) == len(set(keys))  # no charge twice
    final = store.tasks.get(task.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.lease_epoch == 2
    # The ledger counts every call, the zombie's uncommitted one included (kept in the trace).
    from agentq.core.models import LLMStep

    committed = sum(s.body.usage.total for s in steps if isinstance(s.body, LLMStep))
    orphans = [o.call for o in store.steps.orphans(task.task_id)]
    assert all(c.model for c in orphans)
    budget = store.budgets.get(task.task_id)
    assert budget.used == committed + sum(c.usage.total for c in orphans) and budget.reserved == 0
