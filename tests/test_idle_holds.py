"""An interrupted conversation (``idle``) holds no budget hold (docs/ARCHITECTURE.md, invariant 11:
"An idle task holds no lease, no hold and no queue message"), and a hold a SIGKILLed worker left
is counted as spent at its deadline (invariant 4), whatever the run that took the task over
ends with: here it ends ``idle`` (the person interrupted the call the dead worker had in flight),
and then the conversation is cancelled. Real worker processes on the local stack (moto server)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Any

import pytest

from agentq.control import operations
from agentq.control.conversations import interrupt
from agentq.control.submit import submit
from agentq.core.models import TaskStatus
from agentq.runtime import build_registry
from agentq_dev.stack import LocalStack

from tests.helpers import scripted, wait_for


@pytest.fixture
def stack() -> Any:
    # A call lasts at most 15 s here: the successor claims well before the dead call's hold lapses
    # (as with the production default of 600 s), and the test waits out that deadline.
    env = {"PYTHONPATH": os.getcwd(), "AGENTQ_MAX_CALL_SECONDS": "15"}
    with LocalStack(prefix=f"idle{uuid.uuid4().hex[:8]}", workers=0, api=False, tool_modules=("tests.effect_tools",),
                    extra_env=env) as s:  # fmt: skip
        yield s


def test_a_dead_workers_hold_on_a_task_interrupted_to_idle_is_counted_as_spent_at_its_deadline(
    stack: LocalStack,
) -> None:
    store = stack.store()
    assert stack.settings is not None
    sub = scripted([{"text": "a long essay", "latency_seconds": 2.0}, {"text": "short"}], max_tokens=100_000)
    task = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
    doomed = stack.spawn_worker(AGENTQ_CRASH_AT="after_llm_call:1")  # killed once the provider answered
    wait_for(lambda: store.tasks.get(task.task_id).inflight is not None, timeout=60, what="the model call")
    interrupt(store, task.task_id, tenant="t")  # the person presses stop while the call is in flight
    assert doomed.wait(timeout=60) == -signal.SIGKILL

    stack.spawn_worker()  # takes the task over: the interrupt leaves it idle
    idle = wait_for(
        lambda: (t := store.tasks.get(task.task_id)).status is TaskStatus.IDLE and t, timeout=90, what="idle"
    )
    (dead_call,) = idle.lapsed_holds.values()  # the killed worker's call, which the provider may have billed
    assert dead_call.until is not None

    # Its call can no longer complete after ``until``: from then on it is spent (unknown), not held.
    wait_for(lambda: time.time() > dead_call.until + 1, timeout=60, what="the dead call's deadline")
    try:
        wait_for(lambda: store.budgets.get(task.task_id).reserved == 0, timeout=30, what="the hold counted as spent")
    finally:
        print("idle:", store.tasks.get(task.task_id).lapsed_holds, store.budgets.get(task.task_id))
    budget = store.budgets.get(task.task_id)
    assert budget.unknown == dead_call.amount and budget.used == dead_call.amount


def test_a_cancelled_conversation_that_was_idle_leaves_no_hold_reserved(stack: LocalStack) -> None:
    """The same idle task cancelled: the cancel counts the dead worker's hold as spent (or has it
    counted at its deadline), as it does for a cancelled task's current hold."""
    store = stack.store()
    assert stack.settings is not None
    sub = scripted([{"text": "a long essay", "latency_seconds": 2.0}, {"text": "short"}], max_tokens=100_000)
    task = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
    doomed = stack.spawn_worker(AGENTQ_CRASH_AT="after_llm_call:1")
    wait_for(lambda: store.tasks.get(task.task_id).inflight is not None, timeout=60, what="the model call")
    interrupt(store, task.task_id, tenant="t")
    assert doomed.wait(timeout=60) == -signal.SIGKILL
    stack.spawn_worker()
    wait_for(lambda: store.tasks.get(task.task_id).status is TaskStatus.IDLE, timeout=90, what="idle")

    operations.cancel(store, task.task_id, tenant="t", queues=stack.queues())
    (dead_call,) = store.tasks.get(task.task_id).lapsed_holds.values()
    wait_for(lambda: time.time() > (dead_call.until or 0) + 1, timeout=60, what="the dead call's deadline")
    try:
        wait_for(lambda: store.budgets.get(task.task_id).reserved == 0, timeout=30, what="the hold counted as spent")
    finally:
        print("cancelled:", store.tasks.get(task.task_id).lapsed_holds, store.budgets.get(task.task_id))
