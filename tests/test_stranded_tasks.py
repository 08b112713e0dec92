"""Every unfinished task has a way forward, and DLQs hold only what really failed (issue 12.3),
against moto server: receives spent by worker faults never dead-letter a healthy task (the
task's own failures are counted on META, a message whose receives ran past the allowance is
renewed); a duplicate of a finished task's message is deleted; a task left with no message at
all is swept back into its queue; and under random SIGKILL and SIGSTOP of real worker
processes every task ends, none in a DLQ, no charge twice, no traceback in the workers' logs."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus
from agentq.local.moto_server import MotoServer
from agentq.local.stack import LocalStack
from agentq.queueing.dispatch import Dispatcher
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.queueing.sweeper import sweep
from agentq.queueing.worker import WorkerConfig
from agentq.resources import QueueSettings
from agentq.runtime import build_queues, build_registry, build_store

from tests.helpers import call, deployment, scripted, wait_for

MAX_RECEIVES = 2
TIER = "normal"


def _depth(queues: TaskQueues, url: str) -> int:
    attrs = queues.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return sum(
        int(attrs[k])
        for k in (
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        )
    )


def _dispatcher(moto_server: MotoServer) -> tuple[Any, Any, TaskQueues, Dispatcher]:
    settings = deployment(moto_server, max_receive_count=MAX_RECEIVES)
    store, queues = build_store(settings), build_queues(settings)
    engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
    return settings, store, queues, Dispatcher(engine, store, queues, max_receive_count=MAX_RECEIVES)


def test_a_message_whose_receives_went_to_worker_faults_is_renewed_not_dead_lettered(moto_server: MotoServer) -> None:
    _, store, queues, dispatcher = _dispatcher(moto_server)
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    body = TaskMessage(task_id=task.task_id).model_dump_json()
    action = dispatcher.handle(body, tier=TIER, receive_count=MAX_RECEIVES + 1)
    assert action.kind == "delete" and action.reason.startswith("renewed")
    [fresh] = queues.sqs.receive_message(QueueUrl=queues.url(TIER), WaitTimeSeconds=1)["Messages"]
    assert fresh["Body"] == TaskMessage.model_validate_json(body).model_dump_json(exclude_defaults=True)
    assert store.tasks.get(task.task_id).status is TaskStatus.QUEUED  # untouched: the fresh copy runs it
    assert _depth(queues, queues.dlq_url(TIER)) == 0


def test_a_duplicate_of_a_finished_tasks_message_is_deleted_however_often_it_was_received(
    moto_server: MotoServer,
) -> None:
    _, store, queues, dispatcher = _dispatcher(moto_server)
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    body = TaskMessage(task_id=task.task_id).model_dump_json()
    assert dispatcher.handle(body, tier=TIER, receive_count=1).kind == "delete"
    assert store.tasks.get(task.task_id).status is TaskStatus.SUCCEEDED
    for receives in (1, MAX_RECEIVES, MAX_RECEIVES + 5):
        action = dispatcher.handle(body, tier=TIER, receive_count=receives)
        assert (action.kind, action.reason) == ("delete", "task already succeeded")
    assert _depth(queues, queues.url(TIER)) == 0 and _depth(queues, queues.dlq_url(TIER)) == 0


def test_a_task_left_with_no_message_is_swept_back_into_its_queue_once_it_has_been_silent(
    moto_server: MotoServer,
) -> None:
    _, store, queues, _ = _dispatcher(moto_server)
    urgent = scripted([{"text": "done"}]).model_copy(update={"priority": "high"})
    stranded = store.tasks.create(urgent, tenant="t")  # no message was ever sent
    fresh = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    now = store.tasks.get(fresh.task_id).updated_at
    report = sweep(store, queues, stale_after=60, now=now + 30)
    assert stranded.task_id not in report.swept  # not silent long enough yet
    report = sweep(store, queues, stale_after=60, now=now + 61)
    assert set(report.swept) >= {stranded.task_id, fresh.task_id}
    [message] = queues.sqs.receive_message(QueueUrl=queues.url("high"), WaitTimeSeconds=1)["Messages"]
    swept = TaskMessage.model_validate_json(message["Body"])
    assert (swept.task_id, swept.kind) == (stranded.task_id, "swept")
    # a task that has ended is neither swept nor kept on the list
    store.tasks.transition(fresh.task_id, TaskStatus.CANCELLED)
    assert fresh.task_id not in sweep(store, queues, stale_after=60, now=now + 120).swept


# ------------------------------------------------------------------------ real processes

TURNS = [
    {"text": f"turn {i}", "tool_calls": [call("lookup", query=f"q{i}"), call("charge_card", amount_cents=i, memo="m")],
     "latency_seconds": 0.3}
    for i in range(1, 5)
] + [{"text": "all done"}]  # fmt: skip


def test_random_sigkill_and_sigstop_of_workers_never_strand_or_dead_letter_a_healthy_task(tmp_path: Path) -> None:
    """20 tasks, 3 workers, a fault every 1-3 s for 25 s (seeded), with a queue that allows a
    task only two failures of its own: every task succeeds, no DLQ holds anything, no charge
    ran twice, and no worker logged a traceback (expected races are one line)."""
    rng = random.Random(1203)
    ledger = tmp_path / "ledger.jsonl"
    stack = LocalStack(
        prefix=f"strand{os.getpid()}",
        workers=0,
        api=False,
        worker_config=WorkerConfig(lease_seconds=2, heartbeat_seconds=0.5, visibility_seconds=3),
        queue_settings=QueueSettings(visibility_timeout=3, max_receive_count=MAX_RECEIVES),
        tool_modules=("tests.effect_tools",),
        extra_env={"AGENTQ_TEST_LEDGER": str(ledger), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        sweep_every=2.0,
        sweep_stale_after=15.0,
    )
    logs = [tmp_path / f"worker-{i}.log" for i in range(40)]
    workers: list[subprocess.Popen[bytes]] = []
    stopped: set[int] = set()

    def spawn() -> None:
        log = logs[len(workers)].open("wb")
        workers.append(subprocess.Popen(stack.worker_command(), env=stack.env(), stdout=log, stderr=log))

    stack.start()
    try:
        store, queues = stack.store(), stack.queues()
        from agentq.control.submit import submit

        registry = build_registry(stack.settings)  # type: ignore[arg-type]
        ids = [
            submit(store, registry, scripted(TURNS, tools=["lookup", "charge_card"]), tenant="t", queues=queues).task_id
            for _ in range(20)
        ]
        for _ in range(3):
            spawn()
        faults = {"kill": 0, "stop": 0}
        chaos_until = time.monotonic() + 25
        while time.monotonic() < chaos_until:
            time.sleep(rng.uniform(1, 3))
            live = [w for w in workers if w.poll() is None]
            victim = rng.choice(live)
            if victim.pid in stopped:
                os.kill(victim.pid, signal.SIGCONT)
                stopped.discard(victim.pid)
            elif rng.random() < 0.5:
                victim.kill()
                faults["kill"] += 1
                spawn()
            else:
                os.kill(victim.pid, signal.SIGSTOP)
                stopped.add(victim.pid)
                faults["stop"] += 1
                if len([w for w in workers if w.poll() is None and w.pid not in stopped]) < 2:
                    spawn()
        for pid in list(stopped):
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: all(store.tasks.get(t).status.terminal for t in ids), timeout=120, what="every task ended")
        tasks = [store.tasks.get(t) for t in ids]
        for tier in ("high", "normal", "low"):
            assert _depth(queues, queues.dlq_url(tier)) == 0, f"{tier} DLQ holds messages of healthy tasks"
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGCONT)
                w.terminate()
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
        stack.stop()

    assert faults["kill"] + faults["stop"] >= 8
    assert [t.status for t in tasks] == [TaskStatus.SUCCEEDED] * len(ids), [
        (t.task_id, t.status, t.error) for t in tasks
    ]
    assert all(t.result == "all done" for t in tasks)
    charges = [json.loads(line)["key"] for line in ledger.read_text().splitlines()]
    assert len(charges) == len(set(charges))  # at most once, whatever was killed where
    tracebacks = [p.name for p in logs if p.exists() and "Traceback" in p.read_text(errors="replace")]
    assert tracebacks == [], [p.read_text(errors="replace")[-3000:] for p in logs if p.name in tracebacks]
