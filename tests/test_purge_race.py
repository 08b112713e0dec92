"""A purge right after the cancel of a running task, its worker mid-model-call, against a real
worker process (moto server, ``agentq_dev.stack.LocalStack``).

The cancel moves the task to ``cancelled`` at once; its worker learns it only when its call
answers and its commit is refused, and gives back the task's running slot and lets go of it
after that. A purge in between used to delete META (which names the slot) and the partition:
the worker's release found no slot to give back (the tenant's counter leaked one slot, so with
``max_running 1`` nothing of the tenant ran again) and its prepared step landed in the purged
task. Now the purge is refused until the worker lets go (nothing deleted), or it is complete;
either way the slot comes back and nothing of the task is left once it is purged again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from agentq.control import operations
from agentq.control.retention import PurgeResult, purge_task
from agentq.control.submit import submit
from agentq.core.errors import IllegalTransition
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.runtime import build_registry
from agentq.storage import keys
from agentq.worker import WorkerConfig
from agentq_dev.stack import LocalStack

TENANT = "purge-race"


@pytest.fixture(scope="module")
def stack() -> Any:
    with LocalStack(prefix="purgerace", workers=1, api=False, worker_config=WorkerConfig(concurrency=2)) as s:
        yield s


def _until(what: str, pred: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _slow(goal: str) -> dict[str, Any]:
    """A task whose first model call takes 4 s (the tester's ``latency_seconds: 5`` script)."""
    return {
        "goal": goal,
        "provider": "scripted",
        "script": {"turns": [{"text": f"{goal}: step one", "latency_seconds": 4}, {"text": "answer"}]},
    }


def _items(stack: LocalStack, task_id: str) -> list[str]:
    return sorted(str(i["sk"]) for i in stack.store().table.query(keys.task_pk(task_id), keys_only=True))


@pytest.mark.parametrize("attempt", [1, 2])
def test_a_purge_right_after_cancelling_a_task_mid_call_leaks_no_slot_and_lets_no_step_in(
    stack: LocalStack, attempt: int
) -> None:
    store, queues = stack.store(), stack.queues()
    assert stack.settings is not None
    store.slots.set_limit(TENANT, 1)
    body = TaskSubmission.model_validate(_slow(f"slow {attempt}"))
    task_id = submit(store, build_registry(stack.settings), body, tenant=TENANT, queues=queues).task_id

    def mid_call() -> bool:
        meta = store.tasks.metas([task_id])[0]
        return meta["status"] == TaskStatus.RUNNING.value and "inflight" in meta and int(meta["step"]) == 0

    _until("the worker to be in the task's first model call", mid_call)
    assert store.slots.usage(TENANT).running == 1
    operations.cancel(store, task_id, tenant=TENANT, queues=queues, slots=store.slots)

    before = _items(stack, task_id)
    purged: PurgeResult | None = None
    try:
        purged = purge_task(store, task_id)
    except IllegalTransition as refused:  # its worker has not let go: nothing deleted, and it says so
        assert f"task {task_id} is cancelled but its worker" in str(refused) and "has not let go" in str(refused)
        assert "purge it again once its worker lets go" in str(refused)
        assert _items(stack, task_id) == before and store.tasks.get(task_id).status is TaskStatus.CANCELLED
    else:
        assert purged.items == len(before) and _items(stack, task_id) == []  # complete

    # The worker's commit is refused when its call answers; it gives the slot back, then lets go.
    _until("the task's running slot to be given back", lambda: store.slots.usage(TENANT).running == 0, timeout=30)

    def purge_once_let_go() -> bool:
        nonlocal purged
        try:
            purged = purge_task(store, task_id)
        except IllegalTransition:
            return False
        return True

    _until("the purge to go through once the worker let go", purge_once_let_go, timeout=30)
    assert _items(stack, task_id) == [], "an item of the purged task was written after its purge"
    assert store.steps.orphans(task_id) == [] and store.steps.load(task_id) == []

    # The tenant's one slot is free: a new task runs at once (it waited for good with the leak).
    after = TaskSubmission.model_validate({**_slow(f"next {attempt}"), "script": {"turns": [{"text": "done"}]}})
    next_id = submit(store, build_registry(stack.settings), after, tenant=TENANT, queues=queues).task_id
    _until("the tenant's next task to finish", lambda: store.tasks.get(next_id).status.terminal)
    assert store.tasks.get(next_id).status is TaskStatus.SUCCEEDED
    _until("its slot to be given back after its end", lambda: store.slots.usage(TENANT).running == 0, timeout=30)
