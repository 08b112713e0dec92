"""A step commit renews the lease in the write it makes anyway: ``lease_expires`` moves
forward in the META item with no extra AWS call, the session learns the new expiry, and a
task that commits more often than its lease lasts keeps it with no heartbeat at all."""

from __future__ import annotations

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


def test_a_task_committing_faster_than_its_lease_keeps_it_with_no_heartbeat(
    store: Storage, registry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lease 3 s, no heartbeat at all, 21 steps over at least 3.85 s (eleven model turns of 0.35 s
    each, slept by the scripted provider). Each commit moves the lease to a full lease past the
    moment it was sent. Right after each commit made once the claimed lease has run out, a rival
    tries to claim the task: without the renewal it would win the first time. The rival tries on
    that event, not in a loop of its own: a looping rival also won when a loaded machine (load 20)
    took longer than the lease between two commits; this one could only if a single commit did."""
    turns = [
        {"text": f"turn {i}", "latency_seconds": 0.35, "tool_calls": [call("lookup", query=str(i))]} for i in range(10)
    ]
    turns.append({"text": "done", "latency_seconds": 0.35})
    task = store.tasks.create(scripted(turns, tools=["lookup"]), tenant="t")
    engine = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=3.0))
    sessions: list[LeaseState] = []
    claimed_lease: list[float] = []
    rival_tries: list[int] = []
    rival_won: list[int] = []
    short_renewals: list[int] = []
    real_commit = store.steps.commit
    quiet_since = [0.0]  # when the last commit returned: the engine sends the next one later

    def keeper(session: LeaseState) -> Any:  # entered right after the claim
        sessions.append(session)
        claimed_lease.append(session.lease.expires_at)
        quiet_since[0] = time.time()
        return nullcontext()

    def commit_then_rival(lease: Any, step: int, *args: Any, **kwargs: Any) -> Any:
        record = real_commit(lease, step, *args, **kwargs)
        if kwargs.get("finish") is not None:
            return record  # a finishing commit drops the lease: nothing left to take
        if store.tasks.get(task.task_id).lease_expires < quiet_since[0] + 3.0:
            short_renewals.append(step)  # (an assert here would fail the task, not the test)
        if time.time() > claimed_lease[0] + 0.05:  # the lease the claim took has run out
            rival_tries.append(step)
            if store.tasks.claim(task.task_id, "rival", 30) is not None:
                rival_won.append(step)
        quiet_since[0] = time.time()
        return record

    monkeypatch.setattr(store.steps, "commit", commit_then_rival)
    result = engine.run(task.task_id, keeper=keeper)
    assert short_renewals == [], "these steps renewed the lease for less than 3 s"
    assert rival_won == [], f"the lease lapsed between commits (the rival won after steps {rival_won})"
    assert rival_tries, "the run ended before its first lease ran out"  # the sleeps alone take 3.85 s
    assert result.status is TaskStatus.SUCCEEDED
    final = store.tasks.get(task.task_id)
    assert final.lease_epoch == 1 and final.claim_count == 1
    assert sessions[0].lease.expires_at > claimed_lease[0] + 0.5  # the session learned the renewals
