"""Messages under real processes against moto server: a worker SIGKILLed just before and just
after the commit that delivers messages delivers them exactly once; fifty messages sent at once to
a running task are each accepted once, numbered without gaps, and delivered once each, in order."""

from __future__ import annotations

import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agentq.core.models import MessageStep, TaskStatus
from agentq.runtime import Settings, build_store
from agentq.storage.container import Storage
from agentq.worker import run_task

from tests.conftest import child_env
from tests.helpers import agentq_process, call, run_agentq, scripted, wait_for

TURNS: list[dict[str, Any]] = [
    {"text": "looking", "tool_calls": [call("lookup", query="a")]},
    {"text": "answer"},
    {"text": "answer again"},
]


def _delivered(store: Storage, task_id: str) -> list[int]:
    """The seq of every message the conversation holds, in the order it holds them."""
    return [m.seq for s in store.steps.load(task_id) if isinstance(s.body, MessageStep) for m in s.body.messages]


@pytest.mark.parametrize("crash_at", ["after_step_put:1", "after_message_commit:1"])
def test_a_worker_killed_around_the_delivering_commit_delivers_each_message_once(
    crash_at: str, settings: Settings
) -> None:
    store = build_store(settings)
    task = store.tasks.create(scripted(TURNS, tools=["lookup"]), tenant="t")
    for text in ("first", "second"):  # held while queued: delivered by the first run, before any call
        store.messages.accept(task.task_id, text)

    killed = run_agentq(
        ["run-task", task.task_id, "--lease", "1"],
        env=child_env(settings, AGENTQ_CRASH_AT=crash_at, AGENTQ_MAX_CALL_SECONDS="1"), timeout=120,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    before = _delivered(store, task.task_id)
    assert before == ([] if crash_at.startswith("after_step_put") else [1, 2])

    resumed = run_task(task.task_id, settings=settings, lease_seconds=1, wait_seconds=20)
    assert resumed.status is TaskStatus.SUCCEEDED, resumed
    assert _delivered(store, task.task_id) == [1, 2]  # once each, whichever side of the commit it died
    kinds = [s.body.kind for s in store.steps.load(task.task_id)]
    assert kinds == ["message", "llm", "tools", "llm"]
    done = store.tasks.get(task.task_id)
    assert (done.messages_received, done.messages_delivered) == (2, 2)


def test_fifty_messages_sent_at_once_to_a_running_task_arrive_once_each_in_one_order(settings: Settings) -> None:
    store = build_store(settings)
    turns = [{"text": "thinking", "latency_seconds": 1.0}] + [{"text": f"answer {i}"} for i in range(60)]
    # Room for a turn per delivery: how the fifty arrive decides how many deliveries there are.
    task = store.tasks.create(scripted(turns, max_steps=100, max_tokens=10_000_000), tenant="t")
    worker = agentq_process(
        ["run-task", task.task_id, "--lease", "5"],
        env=child_env(settings), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: store.tasks.get(task.task_id).status is TaskStatus.RUNNING, timeout=60, what="the run")
        with ThreadPoolExecutor(max_workers=50) as pool:
            sent = list(pool.map(lambda i: store.messages.accept(task.task_id, f"message {i}"), range(50)))
        _, err = worker.communicate(timeout=180)
        assert worker.returncode == 0, err[-2000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    if store.tasks.get(task.task_id).status is TaskStatus.QUEUED:
        # The agent answered before the last messages came: they were follow-ups that reopened it
        # (send_message would have queued its run; here it is run as a worker would).
        assert (
            run_task(task.task_id, settings=settings, lease_seconds=5, wait_seconds=20).status is TaskStatus.SUCCEEDED
        )

    done = store.tasks.get(task.task_id)
    assert done.status is TaskStatus.SUCCEEDED, (done.status, done.error)
    assert sorted(a.message.seq for a in sent) == list(range(1, 51))  # each accepted once, no gap
    assert [m.seq for m in store.messages.listed(task.task_id)] == list(range(1, 51))
    assert _delivered(store, task.task_id) == list(range(1, 51))  # once each, in the order accepted
    by_seq = {a.message.seq: a.message.text for a in sent}
    held = [m.text for s in store.steps.load(task.task_id) if isinstance(s.body, MessageStep) for m in s.body.messages]
    assert held == [by_seq[i] for i in range(1, 51)]
    assert done.messages_delivered == 50
