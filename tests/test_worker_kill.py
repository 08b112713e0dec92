"""Kill -9 the worker process holding a task: another worker process finishes it from the
last committed step (the queue-driven resume of invariant 1)."""

from __future__ import annotations

import os
import signal
import time

from agentq.control.submit import submit
from agentq.core.models import LLMStep, TaskStatus
from agentq.runtime import build_registry
from agentq_dev.stack import LocalStack

from tests.helpers import call, scripted

# Quick turns up to the kill (at step 6), slower ones after it: the task must still be running
# when the test has seen step 6 and kills its worker, also on a busy machine.
TURNS = [
    {
        "text": f"turn {i}",
        "latency_seconds": 0.3 if i < 3 else 1.0,
        "tool_calls": [call("lookup", query=str(i)), call("charge_card", amount_cents=i + 1, memo=str(i))],
    }
    for i in range(8)
] + [{"text": "finished"}]


def test_a_killed_worker_s_task_completes_on_another_worker_from_its_last_step(tmp_path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    with LocalStack(prefix="kill", workers=2, api=False, tool_modules=("tests.effect_tools",),
                    extra_env={"AGENTQ_TEST_LEDGER": str(ledger),
                               "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))}) as stack:  # fmt: skip
        assert stack.settings is not None
        store = stack.store()
        task = submit(
            store,
            build_registry(stack.settings),
            scripted(TURNS, tools=["lookup", "charge_card"]),
            tenant="t",
            queues=stack.queues(),
        )
        deadline = time.monotonic() + 60
        while (meta := store.tasks.get(task.task_id)).step < 6:
            assert time.monotonic() < deadline and not meta.status.terminal
            time.sleep(0.02)
        victim = stack.worker_by_id(meta.lease_owner or "")
        assert victim is not None
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.time()
        before = store.steps.load(task.task_id)

        while not (final := store.tasks.get(task.task_id)).status.terminal:
            assert time.monotonic() < deadline + 60
            time.sleep(0.05)

        assert final.status is TaskStatus.SUCCEEDED and final.result == "finished"
        claims = stack.store().tasks.claims(final.task_id)
        assert final.claim_count == 2 and claims[0].worker != claims[1].worker
        assert claims[1].worker.endswith(f":{next(p for p in stack.processes if p is not victim).pid}")
        resume_gap = claims[1].at - killed_at
        assert 0 < resume_gap < 15  # visibility 4 s: back well inside the queue's own timeout
        steps = store.steps.load(task.task_id)
        assert steps[: len(before)] == before  # nothing committed before the kill was lost or rewritten
        assert all(s.epoch == 2 for s in steps[len(before) :])
        assert sum(isinstance(s.body, LLMStep) for s in steps) == len(TURNS)
        keys = [line.split('"key": "')[1][:32] for line in ledger.read_text().splitlines()]
        assert len(keys) == len(set(keys))  # no charge twice
