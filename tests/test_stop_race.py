"""The stop button against real worker processes (issue 44 item 3, ARCHITECTURE invariant 17).

Tasks of scope A (end user alice) run in several worker processes, committing a step every few
tenths of a second, with sub-agents, and more of them wait queued behind the workers' capacity;
scope B (bob, same tenant) runs beside them. The stop of A returns with every task of A
cancelled, children included; once each worker let go of its task, no task of A committed a step
past the one its META held when the stop returned; B ran on to the end untouched; a new task of A
is refused until the resume. And a task of A that reached the queue behind the stop's back (its
submission checked the stops just before they were written) is cancelled by the worker that
receives it, never claimed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from agentq.control import operations, stops
from agentq.control.submit import submit
from agentq.core.errors import IllegalTransition
from agentq.core.models import Task, TaskStatus, TaskSubmission
from agentq.core.stops import ScopeStopped, StopScope
from agentq.runtime import build_fanout, build_registry
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.table import STOPPING
from agentq.worker import WorkerConfig
from agentq_dev.stack import LocalStack

from tests.helpers import call

TENANT = "stop-race"
ALICE = StopScope("user", "alice")


def _steady(goal: str, user: str, turns: int = 60) -> dict[str, Any]:
    """A task that commits a step every ~0.3 s for a long while."""
    return {
        "goal": goal,
        "user": user,
        "provider": "scripted",
        "script": {
            "turns": [
                {"text": f"{goal} {i}", "latency_seconds": 0.3, "tool_calls": [call("lookup", query="q")]}
                for i in range(turns)
            ]
            + [{"text": f"{goal} done"}]
        },
        "constraints": {"tools": ["lookup"], "max_steps": 200, "max_tokens": 400_000},
    }


def _fanning(goal: str, user: str) -> dict[str, Any]:
    children = [{k: v for k, v in _steady(f"{goal} child {i}", user).items() if k in ("goal", "script")}
                for i in range(2)]  # fmt: skip
    spawn = call("spawn_subagents", subagents=children, max_concurrency=2)
    return {
        "goal": goal,
        "user": user,
        "provider": "scripted",
        "script": {"turns": [{"text": "fan out", "tool_calls": [spawn]}, {"text": "done"}]},
        # Children inherit max_steps: 200 lets each run its 60 turns; at 20 a child ended
        # cost_exceeded before the stop whenever the setup took over ~6 s (two suites at once).
        "constraints": {"tools": ["spawn_subagents", "lookup"], "max_steps": 200, "max_tokens": 1_000_000},
    }


@pytest.fixture(scope="module")
def stack() -> Any:
    # 3 workers of 4 tasks each: 12 run at once, the rest wait queued for a worker.
    with LocalStack(prefix="stoprace", workers=3, api=False, worker_config=WorkerConfig(concurrency=4),
                    tool_modules=("tests.effect_tools",), extra_env={"PYTHONPATH": os.getcwd()}) as s:  # fmt: skip
        yield s


def _until(what: str, pred: Callable[[], bool], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _submitter(stack: LocalStack, tenant: str) -> Callable[[dict[str, Any]], str]:
    """Submits a task of ``tenant`` as POST /tasks does (the stops read first); returns its id."""
    store, queues = stack.store(), stack.queues()
    assert stack.settings is not None
    tools = build_registry(stack.settings)

    def sub(body: dict[str, Any]) -> str:
        return submit(store, tools, TaskSubmission.model_validate(body), tenant=tenant, queues=queues).task_id

    return sub


def _trees(store: Storage, roots: list[str]) -> list[Task]:
    return [t for r in roots for t in operations.subtree(store, store.tasks.get(r))]


def _committed_numbers(store: Storage, task_id: str, upto: int) -> list[int]:
    items = store.table.query(keys.task_pk(task_id), prefix=keys.STEP)
    return sorted(int(i["number"]) for i in items if int(i["number"]) <= upto)


def test_a_stop_cancels_its_scope_in_every_worker_and_no_step_of_it_commits_after(stack: LocalStack) -> None:
    store, queues = stack.store(), stack.queues()
    assert stack.settings is not None
    sub = _submitter(stack, TENANT)

    # 2 roots with 2 children each, 4 more of alice's and 2 of bob's: the 12 slots of the workers.
    alice_roots = [sub(_fanning(f"alice fan {i}", "alice")) for i in range(2)]
    alice_roots += [sub(_steady(f"alice {i}", "alice")) for i in range(4)]
    bob = [sub(_steady(f"bob {i}", "bob", turns=40)) for i in range(2)]

    def running_alice() -> list[Task]:
        return [t for t in _trees(store, alice_roots) if t.status is TaskStatus.RUNNING and t.step >= 2]

    _until("alice's tasks running in the workers, children included",
           lambda: len(running_alice()) >= 6 and sum(1 for t in running_alice() if t.parent_id) >= 2)  # fmt: skip
    alice_roots += [sub(_steady(f"alice queued {i}", "alice")) for i in range(4)]  # no slot left: they wait
    bob += [sub(_steady("bob queued", "bob", turns=3))]
    before = _trees(store, alice_roots)
    assert any(t.status is TaskStatus.QUEUED for t in before), "some of alice's tasks should wait queued"
    claimed_by = {str(m.get("owner_worker")) for m in store.tasks.metas([t.task_id for t in running_alice()])}
    assert len(claimed_by) >= 2, f"alice's tasks should run in several workers, not {claimed_by}"

    report = stops.stop(store, TENANT, ALICE, by="test", fanout=build_fanout(stack.settings), queues=queues)
    returned = time.time()

    tree = _trees(store, alice_roots)
    assert {t.task_id for t in tree} <= set(report.cancelled) | {t.task_id for t in before if t.status.terminal}
    assert all(t.status is TaskStatus.CANCELLED for t in tree), [(t.task_id, t.status) for t in tree]
    assert report.were_running and set(report.were_running) <= set(report.cancelled)
    at_stop = {t.task_id: t.step for t in tree}

    # The workers meet the cancel at their next step boundary, where the commit is refused.
    _until("every worker to let go of alice's tasks",
           lambda: not any(m.get("owner_worker") for m in store.tasks.metas(list(at_stop))))  # fmt: skip
    after = {t.task_id: t for t in _trees(store, alice_roots)}
    assert {i: t.step for i, t in after.items()} == at_stop  # no commit moved META on
    for task_id, step in at_stop.items():
        assert _committed_numbers(store, task_id, 10**6) == list(range(1, step + 1)) or all(
            n <= step for n in _committed_numbers(store, task_id, step)
        )
        for record in store.steps.load(task_id):
            assert record.committed_at <= returned, f"{task_id} step {record.number} committed after the stop"

    # New work in the scope is refused, bob's goes on, until the resume.
    with pytest.raises(ScopeStopped) as refused:
        sub(_steady("alice again", "alice", turns=1))
    assert refused.value.to_dict()["scope"] == {"kind": "user", "value": "alice"}
    _until("bob's tasks to finish", lambda: all(store.tasks.get(b).status.terminal for b in bob))
    assert [store.tasks.get(b).status for b in bob] == [TaskStatus.SUCCEEDED] * len(bob)

    assert stops.resume(store, TENANT, ALICE) is not None
    again = sub(_steady("alice resumed", "alice", turns=1))
    _until("alice's new task to finish", lambda: store.tasks.get(again).status.terminal)
    assert store.tasks.get(again).status is TaskStatus.SUCCEEDED


def test_a_task_of_a_stopped_scope_that_reached_the_queue_anyway_is_cancelled_unclaimed(stack: LocalStack) -> None:
    """A submission that checked the stops just before the stop was written creates its task
    after the stop's listing: the worker that receives it reads the stops first."""
    store, queues = stack.store(), stack.queues()
    scope = StopScope("user", "carol")
    stops.stop(store, TENANT, scope, by="test")
    body = TaskSubmission.model_validate(_steady("carol behind the stop", "carol", turns=3))
    task = store.tasks.create(body, tenant=TENANT)  # what the late submission writes, unchecked
    queues.send(task.task_id, body.priority, tenant=TENANT)
    _until("the worker to end it", lambda: store.tasks.get(task.task_id).status.terminal)
    ended = store.tasks.get(task.task_id)
    assert ended.status is TaskStatus.CANCELLED and ended.claim_count == 0 and ended.step == 0
    assert ended.error is not None and "stopped: user 'carol'" in ended.error["message"]
    stops.resume(store, TENANT, scope)


# What ``agentq stop`` runs, in a process of its own that the test kills at a crash point.
_STOPPER = """
import sys
from agentq.control import stops
from agentq.core.stops import StopScope
from agentq.runtime import Settings, build_store
stops.stop(build_store(Settings.from_env()), sys.argv[1], StopScope("user", "alice"), by="a stopper killed mid-way")
"""


def test_a_stop_killed_after_its_marks_leaves_its_scope_fenced_and_its_tasks_deliveries_cancel_them(
    stack: LocalStack,
) -> None:
    """The stop's process is SIGKILLed once every task of the scope is marked and none moved
    to ``cancelled``: the workers meet the marks at their next commit and give the tasks back,
    no step of the scope commits after the marks, a new task of it is refused (the stop was
    stored first), and each task's next delivery (a few seconds on) finds its scope stopped and
    cancels it, the mark gone; the stop run again finds nothing left."""
    tenant = "stop-killed"
    store, queues = stack.store(), stack.queues()
    sub = _submitter(stack, tenant)

    alice = [sub(_steady(f"alice {i}", "alice")) for i in range(6)]
    bob = sub(_steady("bob", "bob", turns=30))
    _until("alice's tasks running in the workers",
           lambda: all(m["status"] == "running" and int(m["step"]) >= 2 for m in store.tasks.metas(alice)))  # fmt: skip

    stopper = subprocess.run([sys.executable, "-c", _STOPPER, tenant], env=stack.env(AGENTQ_CRASH_AT="after_stop_marks"),
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    killed = time.time()
    assert stopper.returncode == -signal.SIGKILL, stopper.stderr
    marked = store.tasks.metas(alice)
    assert all(m.get(STOPPING) == "user 'alice'" for m in marked), marked
    at_mark = {str(m["task_id"]): int(m["step"]) for m in marked}  # nothing commits once marked
    with pytest.raises(ScopeStopped):
        sub(_steady("alice again", "alice", turns=1))

    _until("each task's next delivery to cancel it",
           lambda: all(m["status"] == "cancelled" for m in store.tasks.metas(alice)))  # fmt: skip
    after = store.tasks.metas(alice)
    assert not any(STOPPING in m for m in after), after
    assert {str(m["task_id"]): int(m["step"]) for m in after} == at_mark
    for task_id in alice:
        for record in store.steps.load(task_id):
            assert record.committed_at <= killed, f"{task_id} step {record.number} committed after its mark"
            assert record.number <= at_mark[task_id]
    assert stops.stop(store, tenant, ALICE, by="test", queues=queues).cancelled == []
    assert store.tasks.get(bob).status in (TaskStatus.RUNNING, TaskStatus.SUCCEEDED)  # never marked
    try:
        operations.cancel(store, bob, tenant=tenant, queues=queues)
    except IllegalTransition:  # under load its 30 turns may be done by now
        assert store.tasks.get(bob).status is TaskStatus.SUCCEEDED
    stops.resume(store, tenant, ALICE)
