"""Invariants 2 and 4 with real processes: a worker paused (SIGSTOP) past its lease, superseded
by another worker, then woken (SIGCONT), can commit nothing, and its call in flight is charged
once without pushing the budget past its cap."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus
from agentq.queueing.queues import TaskMessage
from agentq.runtime import Settings
from agentq.storage.container import Storage
from agentq_dev.moto_server import MotoServer

from tests.conftest import child_env
from tests.fake_messages_api import FakeMessagesAPI, StopBeforeAnswer, anthropic_env, message_reply, usage_dict
from tests.helpers import agentq_process, call, deployment, scripted, wait_for

TURNS = [
    {
        "text": f"turn {i}",
        "latency_seconds": 0.4,
        "tool_calls": [call("lookup", query=str(i)), call("charge_card", amount_cents=i, memo=str(i))],
    }
    for i in range(6)
] + [{"text": "done", "latency_seconds": 0.4}]


def _spawn(settings: Settings, task_id: str, ledger: Path, wait: float, lease: float = 1) -> subprocess.Popen[str]:
    """A worker for one task. The zombie's lease is short so that a pause outlasts it; a
    successor's is long so that a loaded CI machine cannot starve its heartbeat into a loss."""
    return agentq_process(
        ["run-task", task_id, "--lease", str(lease), "--wait", str(wait)],
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
        successor = _spawn(settings, task.task_id, ledger, wait=10, lease=10)
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
    final = store.tasks.get(task.task_id)
    # Nothing of the zombie's after the takeover: the successor reserved on top of its live hold.
    assert final.lease_epoch == 2 and all(s.epoch == 2 for s in steps[frozen_at:])
    keys = [json.loads(line)["key"] for line in ledger.read_text().splitlines()]
    assert len(keys) == len(set(keys))  # no charge twice
    assert final.status is TaskStatus.SUCCEEDED
    # The ledger counts every call, the zombie's uncommitted one included (kept in the trace).
    from agentq.core.models import LLMStep

    committed = sum(s.body.usage.total for s in steps if isinstance(s.body, LLMStep))
    orphans = [o.call for o in store.steps.orphans(task.task_id)]
    assert all(c.model for c in orphans)
    budget = store.budgets.get(task.task_id)
    assert budget.used == committed + sum(c.usage.total for c in orphans) and budget.reserved == 0


CAP = 1800
MAX_OUT = 1000
# One answer fits the cap, two do not. The input count is what a real tokenizer gives for this
# short request (under the engine's estimate of JSON length / 3, as with a real model).
BIG_ANSWER = {"input_tokens": 20, "output_tokens": 900}


def _anthropic_one_turn() -> dict[str, object]:
    return {
        "goal": "answer in one turn",
        "provider": "anthropic",
        "constraints": {"max_tokens": CAP, "max_output_tokens": MAX_OUT, "tools": []},
    }


@pytest.mark.parametrize("run", range(3))
def test_a_zombies_call_in_flight_is_charged_once_and_its_successor_never_overshoots_the_cap(
    settings: Settings, store: Storage, run: int
) -> None:
    """Issue 12.1 with real processes: A is paused mid call past its lease, B takes over, A
    wakes and its call completes. B cannot reserve on top of A's live hold (one answer fits
    the cap, two do not), so it waits for the hold's deadline (reservation + slack +
    AGENTQ_MAX_CALL_SECONDS) instead of returning it, so ``used <= cap``; and A's answered call
    is charged exactly once, as an orphan, so ``used`` equals what the provider delivered."""
    from agentq.core.models import TaskSubmission

    stop_a = StopBeforeAnswer()
    with FakeMessagesAPI(within_max_tokens=True) as fake:
        fake.enqueue(
            dataclasses.replace(
                message_reply([{"type": "text", "text": "A's answer"}], usage=usage_dict(**BIG_ANSWER)),
                before_send=stop_a,
            ),
            message_reply([{"type": "text", "text": "B's answer"}], usage=usage_dict(**BIG_ANSWER)),
        )
        task = store.tasks.create(TaskSubmission.model_validate(_anthropic_one_turn()), tenant="t")
        # The hold's deadline must outlast A's pause (the premise: a call cannot take longer than
        # the configured maximum), also on a loaded machine: 8 s against a pause of ~1.5 s.
        env = {**anthropic_env(fake), "AGENTQ_MAX_CALL_SECONDS": "8"}
        zombie = _spawn_with(settings, task.task_id, env, wait=0)
        stop_a.caller(zombie.pid)
        try:
            _wait_for(stop_a.stopped.is_set)  # A's call on the wire, A stopped: its answer, sent next, waits unread
            # claims once A's lease (1 s) lapses
            successor = _spawn_with(settings, task.task_id, env, wait=60, lease=10)
            _wait_for(lambda: store.tasks.get(task.task_id).lease_epoch >= 2)
        finally:
            os.kill(zombie.pid, signal.SIGCONT)  # A's answer arrives now; its lease is gone
        z_out, z_err = zombie.communicate(timeout=60)
        _, s_err = successor.communicate(timeout=90)
        delivered = sum(u["input_tokens"] + u["output_tokens"] for u in fake.delivered_usage)

    assert json.loads(z_out.strip().splitlines()[-1])["outcome"] == "lease_lost", z_err[-2000:]
    final = store.tasks.get(task.task_id)
    assert final.status.terminal, s_err[-2000:]
    budget = store.budgets.get(task.task_id)
    print(f"run {run}: used={budget.used} cap={budget.cap} provider={delivered} calls={len(fake.delivered_usage)}")
    assert len(fake.delivered_usage) == 2  # both calls were answered
    assert budget.used <= budget.cap
    assert budget.used == delivered and budget.reserved == 0
    orphans = store.steps.orphans(task.task_id)
    assert len(orphans) == 1 and orphans[0].call.usage.total == sum(BIG_ANSWER.values())


@pytest.mark.parametrize("then", ["woken", "killed"])
def test_a_call_answered_to_a_worker_paused_past_its_holds_deadline_never_pushes_used_past_the_cap(
    settings: Settings, store: Storage, then: str
) -> None:
    """Issue 23.4 with real processes: A's call is answered while A is paused (SIGSTOP) past its
    hold's deadline. B takes over, waits out the deadline, and then counts A's hold as spent
    (never returned: A may report it), reserving only what is left. Woken (SIGCONT), A reports
    its answer and the ledger is corrected to the provider's usage; killed (SIGKILL), A never
    reports and the hold stays counted. Either way ``used <= cap``."""
    from agentq.core.models import TaskSubmission

    stop_a = StopBeforeAnswer()
    with FakeMessagesAPI(within_max_tokens=True) as fake:
        fake.enqueue(
            dataclasses.replace(
                message_reply([{"type": "text", "text": "A's answer"}], usage=usage_dict(**BIG_ANSWER)),
                before_send=stop_a,
            ),
            message_reply([{"type": "text", "text": "B's answer"}], usage=usage_dict(**BIG_ANSWER)),
        )
        task = store.tasks.create(TaskSubmission.model_validate(_anthropic_one_turn()), tenant="t")
        # A short maximum call time: A's hold's deadline (reservation + 2 s slack + 2 s) passes
        # while A is paused, so B counts it as spent instead of waiting on it.
        env = {**anthropic_env(fake), "AGENTQ_MAX_CALL_SECONDS": "2"}
        zombie = _spawn_with(settings, task.task_id, env, wait=0)
        stop_a.caller(zombie.pid)
        try:
            _wait_for(stop_a.stopped.is_set)  # A's call is on the wire, and A stopped before its answer
            _wait_for(lambda: len(fake.delivered_usage) == 1)  # answered: it waits in A's socket
            successor = _spawn_with(settings, task.task_id, env, wait=60, lease=10)
            _wait_for(lambda: store.tasks.get(task.task_id).status.terminal, timeout=60)  # B took over and ended
            _, s_err = successor.communicate(timeout=60)
            spent_while_paused = store.budgets.get(task.task_id)
            assert spent_while_paused.used <= spent_while_paused.cap, s_err[-2000:]
        finally:
            os.kill(zombie.pid, signal.SIGKILL if then == "killed" else signal.SIGCONT)
        z_out, z_err = zombie.communicate(timeout=60)
        delivered = sum(u["input_tokens"] + u["output_tokens"] for u in fake.delivered_usage)

    if then == "killed":
        # B may end before A's hold's deadline (its run then says so, and the dispatcher comes
        # back with a ``release_holds`` message): what that message does, once the deadline passed.
        engine = Engine(store, worker_id="sweep", config=EngineConfig(lease_seconds=5))
        _wait_for(lambda: engine.spend_lapsed_holds(store.tasks.get(task.task_id)) == 0, timeout=30)
    budget = store.budgets.get(task.task_id)
    print(f"{then}: used={budget.used} cap={budget.cap} provider={delivered} calls={len(fake.delivered_usage)}")
    assert len(fake.delivered_usage) == 2  # both calls were answered
    assert budget.used <= budget.cap and budget.reserved == 0
    if then == "woken":
        assert json.loads(z_out.strip().splitlines()[-1])["outcome"] == "lease_lost", z_err[-2000:]
        assert budget.used == delivered  # corrected to what the provider delivered
        assert len(store.steps.orphans(task.task_id)) == 1
    else:
        # Never reported: A's hold stays counted in full (the call's outcome is unknown).
        assert budget.used >= delivered


def _spawn_with(
    settings: Settings, task_id: str, env: dict[str, str], wait: float, lease: float = 1
) -> subprocess.Popen[str]:
    return agentq_process(
        ["run-task", task_id, "--lease", str(lease), "--wait", str(wait)],
        env=child_env(settings, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_task_that_ends_with_a_lost_leases_hold_still_counted_spends_it_after_its_deadline(
    moto_server: MotoServer,
) -> None:
    """The successor finished on top of epoch 1's live hold: the dispatcher sends a delayed
    ``release_holds`` message, and handling it after the deadline counts the hold as spent, once."""
    from agentq.core.engine import Engine, EngineConfig
    from agentq.runtime import build_dispatcher, build_queues, build_registry, build_store

    settings = deployment(moto_server)
    store, queues = build_store(settings), build_queues(settings)
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    claim = store.tasks.claim(task.task_id, "lost", 30)
    assert claim is not None
    lost = claim[0]
    store.budgets.reserve(lost, task.task_id, 400, 1, until=time.time() + 2.5)  # its call may be in flight
    store.tasks.release(lost)  # the lease lapses (what SIGSTOP past it does)

    engine = Engine(store, worker_id="w2", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
    dispatcher = build_dispatcher(engine, store, queues, max_receive_count=5)
    action = dispatcher.handle(TaskMessage(task_id=task.task_id).model_dump_json(), tier="normal", receive_count=1)
    assert action.kind == "delete" and store.tasks.get(task.task_id).status is TaskStatus.SUCCEEDED
    budget = store.budgets.get(task.task_id)
    assert budget.reserved == 400 and budget.used + budget.reserved <= budget.cap  # still counted, after the end

    received = wait_for(
        lambda: queues.sqs.receive_message(QueueUrl=queues.url("normal"), WaitTimeSeconds=1).get("Messages"),
        timeout=10,
        what="the delayed release_holds message",
    )
    [message] = received
    assert TaskMessage.model_validate_json(message["Body"]).kind == "release_holds"
    dispatcher.handle(message["Body"], tier="normal", receive_count=1)
    assert store.budgets.get(task.task_id).reserved == 0 and store.tasks.get(task.task_id).lapsed_holds == {}
    # Its outcome unknown at the deadline, the hold is counted as spent, not returned: the lost
    # worker may have been answered and report it later (then it is corrected).
    assert store.budgets.get(task.task_id).used == budget.used + 400 <= budget.cap


def test_a_worker_that_learns_of_its_lost_lease_before_its_call_starts_gives_the_hold_back_at_once(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused between its reservation and its call, the worker finds at the call's start that
    its lease is gone. Nothing went on the wire, so nothing can be charged: its hold goes back
    now, not at its deadline (before, it stayed counted until a ``release_holds`` message)."""
    from agentq.core.engine import Engine, EngineConfig, _holds, _llm_turn
    from agentq.runtime import build_registry, build_store

    settings = deployment(moto_server)
    store = build_store(settings)
    task = store.tasks.create(scripted([{"text": "never said"}]), tenant="t")
    stolen: list[str] = []

    def pause_past_the_lease(name: str) -> None:
        if name == "after_reserve" and not stolen:
            time.sleep(1.2)  # the lease (1 s) lapses, and the call's start is later than its slack
            claim = store.tasks.claim(task.task_id, "successor", 30)
            assert claim is not None
            stolen.append(claim[0].owner)

    monkeypatch.setattr(_llm_turn, "crash_point", pause_past_the_lease)
    monkeypatch.setattr(_holds, "CALL_START_SLACK_SECONDS", 0.5)
    engine = Engine(store, worker_id="zombie", tools=build_registry(settings), config=EngineConfig(lease_seconds=1))
    result = engine.run(task.task_id, keeper=lambda session: contextlib.nullcontext())  # paused: no heartbeat

    assert result.outcome == "lease_lost" and stolen
    budget = store.budgets.get(task.task_id)
    assert budget.reserved == 0 and budget.used == 0
    assert store.steps.orphans(task.task_id) == []
