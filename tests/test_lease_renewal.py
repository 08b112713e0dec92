"""A step commit renews the lease in the write it makes anyway: ``lease_expires`` moves
forward in the META item with no extra AWS call, the session learns the new expiry, and a
task that commits more often than its lease lasts keeps it with no heartbeat at all."""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig, LeaseState
from agentq.core.errors import LeaseLost
from agentq.core.models import LLMStep, TaskStatus
from agentq.storage.container import Storage

from tests.helpers import call, dynamo, scripted


class CallLog:
    """Counts the DynamoDB operations a client sends (botocore's before-call event)."""

    def __init__(self, client: Any) -> None:
        self.ops: list[str] = []
        client.meta.events.register("before-call.dynamodb.*", self._seen)

    def _seen(self, model: Any, **_: Any) -> None:
        self.ops.append(model.name)


def _llm_step() -> LLMStep:
    return LLMStep.model_validate(
        {
            "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn",
            "model": "scripted",
            "usage": {"input_tokens": 1, "output_tokens": 1},
            "started_at": time.time(),
            "duration_ms": 1,
        }
    )


def test_a_commit_moves_lease_expires_forward_in_its_meta_write_with_no_extra_call(store: Storage) -> None:
    task = store.tasks.create(scripted([{"text": "x"}]), tenant="t")
    claimed = store.tasks.claim(task.task_id, "w", 2)
    assert claimed is not None
    lease, _ = claimed
    calls = CallLog(dynamo(store).client)
    until = time.time() + 60
    store.steps.commit(lease, 1, _llm_step(), root_id=task.task_id, lease_until=until)
    assert calls.ops == ["PutItem", "UpdateItem"]  # the step item, then META (the commit point, the renewal)
    meta = store.tasks.get(task.task_id)
    assert meta.lease_expires == pytest.approx(until) and meta.lease_expires > lease.expires_at + 50
    assert meta.lease_epoch == lease.epoch and meta.step == 1


def test_a_commit_under_a_superseded_epoch_still_fails_and_renews_nothing(store: Storage) -> None:
    task = store.tasks.create(scripted([{"text": "x"}]), tenant="t")
    old, _ = store.tasks.claim(task.task_id, "w1", 0.01)  # type: ignore[misc]
    time.sleep(0.05)
    new, _ = store.tasks.claim(task.task_id, "w2", 30)  # type: ignore[misc]
    with pytest.raises(LeaseLost):
        store.steps.commit(old, 1, _llm_step(), root_id=task.task_id, lease_until=time.time() + 600)
    meta = store.tasks.get(task.task_id)
    assert meta.lease_epoch == new.epoch and meta.lease_expires == pytest.approx(new.expires_at) and meta.step == 0


def test_a_finishing_commit_drops_the_lease_whatever_lease_until_says(store: Storage) -> None:
    task = store.tasks.create(scripted([{"text": "x"}]), tenant="t")
    lease, _ = store.tasks.claim(task.task_id, "w", 30)  # type: ignore[misc]
    store.steps.commit(
        lease,
        1,
        _llm_step(),
        root_id=task.task_id,
        finish=TaskStatus.SUCCEEDED,
        result="x",
        lease_until=time.time() + 60,
    )
    assert store.tasks.get(task.task_id).lease_expires == 0


def test_a_task_committing_faster_than_its_lease_keeps_it_with_no_heartbeat(store: Storage, registry: Any) -> None:
    """Lease 3 s, no heartbeat at all, 21 steps over at least 3.85 s (eleven model turns of 0.35 s
    each, slept by the scripted provider): a rival claims in a loop the whole
    time. Without the renewal in each commit the lease would lapse after 3 s and the rival
    would take the task over. (The lease is ~8 turns long so that a loaded machine's slow commit
    cannot outlast it; a lease of 1 s failed once at load 30.)"""
    turns = [
        {"text": f"turn {i}", "latency_seconds": 0.35, "tool_calls": [call("lookup", query=str(i))]} for i in range(10)
    ]
    turns.append({"text": "done", "latency_seconds": 0.35})
    task = store.tasks.create(scripted(turns, tools=["lookup"]), tenant="t")
    engine = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=3.0))
    sessions: list[LeaseState] = []
    claimed_lease = []
    stop = threading.Event()
    rival_won = []

    def keeper(session: LeaseState) -> Any:  # entered right after the claim: the rival starts then
        sessions.append(session)
        claimed_lease.append(session.lease.expires_at)
        thread.start()
        return nullcontext()

    def rival() -> None:
        while not stop.is_set():
            if store.tasks.claim(task.task_id, "rival", 30) is not None:
                rival_won.append(time.time())
                return
            time.sleep(0.05)

    thread = threading.Thread(target=rival, daemon=True)
    began = time.monotonic()
    try:
        result = engine.run(task.task_id, keeper=keeper)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert rival_won == [], "the lease lapsed between commits"
    assert time.monotonic() - began > 3.5  # longer than the lease (the turns' sleeps alone give 3.85 s)
    assert result.status is TaskStatus.SUCCEEDED
    final = store.tasks.get(task.task_id)
    assert final.lease_epoch == 1 and final.claim_count == 1
    assert sessions[0].lease.expires_at > claimed_lease[0] + 0.5  # the session learned the renewals
