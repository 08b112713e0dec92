"""A task parked ``waiting``, ``paused`` or ``idle`` holds no running slot (ARCHITECTURE 12,
"Which states hold a slot"), even when the worker whose run parked it died before giving the
slot back: the task's next message gives it back (``queueing.dispatch._gate.release_parked``),
and when no message comes the sweeper does. Without it the slot stayed taken for good: a
parent held the one its children needed, so they waited until their deadline. And a parent
woken by its fan-out runs on slots it holds when it runs, never on the ones a stale read named
(``queueing.dispatch._wake``).

The dispatcher runs on the in-memory twin with the tier queues on moto server; the last test
kills a real worker process between its run's park and the release
(``tests/parked_release_faults.py``)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch import Dispatcher
from agentq.queueing.queues import MessageKind, TaskMessage, TaskQueues
from agentq.queueing.sweeper import sweep
from agentq.runtime import build_queues
from agentq.storage.container import Storage
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment
from tests.test_fair_share import _dispatcher, _received, _received_ids, _submit

STORAGE = "memory"


@pytest.fixture(scope="module")
def queues(moto_server: MotoServer) -> TaskQueues:
    return build_queues(deployment(moto_server))


def _parked_by_a_dead_worker(dispatcher: Dispatcher, tenant: str, parked_as: TaskStatus) -> Task:
    """A task of ``tenant`` admitted, claimed, and parked ``parked_as`` by its run (a spawn, an
    approval, an interrupt), its worker SIGKILLed before the dispatcher's release: parked and
    still naming its slot."""
    store = dispatcher.store
    task = _submit(store, tenant)
    assert dispatcher.fair.admit(task, "normal").waits is None
    claimed = store.tasks.claim(task.task_id, "dead-worker", 30)
    assert claimed is not None
    store.tasks.transition(task.task_id, parked_as, lease=claimed[0])
    assert store.tasks.get(task.task_id).slots and store.slots.with_default(1).usage(tenant).running == 1
    return task


@pytest.mark.parametrize("kind", ["run", "approval_due"])
@pytest.mark.parametrize("parked_as", [TaskStatus.WAITING, TaskStatus.PAUSED, TaskStatus.IDLE])
def test_a_parked_tasks_next_message_gives_back_the_slot_its_dead_worker_never_released_and_wakes_the_waiter(
    store: Storage, queues: TaskQueues, registry: Any, parked_as: TaskStatus, kind: MessageKind
) -> None:
    """``run``: the dead worker's own message, made visible by the liveness hand-off.
    ``approval_due``: a kind whose handler deletes it before any run (no approval due)."""
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    tenant = f"parked-{parked_as.value}-{kind}"
    parked = _parked_by_a_dead_worker(dispatcher, tenant, parked_as)
    waiter = _submit(store, tenant)
    assert "waits queued" in dispatcher.fair.admit(waiter, "normal").waits  # type: ignore[operator]
    _received(queues)

    body = TaskMessage(task_id=parked.task_id, kind=kind).model_dump_json()
    action = dispatcher.handle(body, tier="normal", receive_count=1)

    assert action.kind == "delete"
    assert store.tasks.get(parked.task_id).status is parked_as and store.tasks.get(parked.task_id).slots == []
    assert store.slots.with_default(1).usage(tenant).running == 0, "the parked task still holds its slot"
    assert _received_ids(queues) == [waiter.task_id]  # the slot given back woke its tenant's waiter
    assert dispatcher.handle(TaskMessage(task_id=waiter.task_id).model_dump_json(), tier="normal",
                             receive_count=1).kind == "delete"  # fmt: skip
    assert store.tasks.get(waiter.task_id).status is TaskStatus.SUCCEEDED


def test_a_parked_tasks_next_message_gives_nothing_back_twice_when_its_worker_released_meanwhile(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    """The dead worker was only slow: its release lands first, and the next message's finds nothing to give back."""
    dispatcher = _dispatcher(store, queues, registry, limit=2)
    parked = _parked_by_a_dead_worker(dispatcher, "slow", TaskStatus.WAITING)
    other = _submit(store, "slow")
    assert dispatcher.fair.admit(other, "normal").waits is None
    assert dispatcher.fair.release(parked.task_id)  # the slow worker's release
    assert dispatcher.handle(TaskMessage(task_id=parked.task_id).model_dump_json(), tier="normal",
                             receive_count=1).kind == "delete"  # fmt: skip
    assert store.slots.with_default(2).usage("slow").running == 1  # ``other``'s: nothing given back twice


def test_the_sweeper_gives_back_a_parked_tasks_slot_when_no_message_comes_and_wakes_the_waiter(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    """Its message lost too (a purge, a DLQ): the sweeper's pass finds the parked task in the
    METAs it reads anyway, quiet ``stale_after`` and still naming a slot, and gives it back;
    before ``stale_after`` it leaves the release to the worker that may be about to make it."""
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    parked = _parked_by_a_dead_worker(dispatcher, "swept", TaskStatus.IDLE)
    waiter = _submit(store, "swept")
    assert "waits queued" in dispatcher.fair.admit(waiter, "normal").waits  # type: ignore[operator]
    _received(queues)

    sweep(store, queues, stale_after=60, default_max_running=1)
    assert store.slots.with_default(1).usage("swept").running == 1 and _received(queues) == []

    late = sweep(store, queues, stale_after=60, now=time.time() + 61, default_max_running=1)
    assert store.slots.with_default(1).usage("swept").running == 0, "the parked task still holds its slot"
    assert store.tasks.get(parked.task_id).status is TaskStatus.IDLE and store.tasks.get(parked.task_id).slots == []
    assert _received_ids(queues) == [waiter.task_id]  # woken by the release, sent once
    assert late.given_back == [parked.task_id]
    assert sweep(store, queues, stale_after=60, now=time.time() + 61, default_max_running=1).given_back == []


def test_a_parent_whose_worker_died_between_its_spawn_park_and_its_release_lets_its_children_run() -> None:
    """Real processes: a tenant limited to 1 running task; the root spawns two quick children
    and parks ``waiting``; its worker is SIGKILLed between the park and the slot's release. A
    second worker takes the dead one's message over (the liveness hand-off), gives the slot back,
    and the children, which need the tenant's one slot, run; then the root ends."""
    from agentq.control.submit import submit
    from agentq.runtime import build_registry
    from agentq_dev.stack import LocalStack

    from tests.helpers import call, scripted, wait_for

    spawn = call("spawn_subagents",
                 subagents=[{"goal": f"c{i}", "script": {"turns": [{"text": f"r{i}"}]}} for i in range(2)])  # fmt: skip
    turns = [{"text": "", "tool_calls": [spawn]}, {"text": "done"}]
    with LocalStack(prefix=f"parked{os.getpid() % 10000}", workers=0, api=False) as stack:
        assert stack.settings is not None
        store = stack.store()
        store.slots.set_limit("t", 1)
        pythonpath = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))
        doomed = stack.spawn_worker(
            PYTHONPATH=pythonpath,
            AGENTQ_TOOL_MODULES=",".join([*stack.settings.tool_modules, "tests.parked_release_faults"]),
            AGENTQ_TEST_KILLED_AT_PARKED_RELEASE="1",
        )
        sub = scripted(turns, tools=["spawn_subagents"], max_tokens=30_000)
        sub.constraints.timeout_seconds = 90
        root = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
        wait_for(lambda: doomed.poll() is not None, timeout=90, what="the root's worker killed at the release")
        assert store.tasks.get(root.task_id).status is TaskStatus.WAITING
        assert store.slots.usage("t").running == 1  # the dead worker's release never came
        stack.spawn_worker()  # the survivor: takes the dead worker's message over
        final = wait_for(lambda: (t := store.tasks.get(root.task_id)).status.terminal and t, timeout=150,
                         what="the root's end")  # fmt: skip
        children = store.tasks.get_many(store.spawns.list(root.task_id)[0].children)
        assert [c.status for c in children] == [TaskStatus.SUCCEEDED] * 2, [c.status.value for c in children]
        assert final.status is TaskStatus.SUCCEEDED and final.result == "done"
        assert store.slots.usage("t").running == 0


@pytest.mark.parametrize("read_as", [TaskStatus.WAITING, TaskStatus.RUNNING])
def test_a_woken_parent_whose_slot_a_late_release_gave_to_another_task_is_admitted_again_not_run_on_none(
    store: Storage, queues: TaskQueues, registry: Any, monkeypatch: pytest.MonkeyPatch, read_as: TaskStatus
) -> None:
    """Worker A's run spawned; A is slow to give the parent's slot back (a GC pause, a starved
    CPU). The children end and the fan-out's wake reaches worker B, which reads the parent
    naming its slot, ``waiting`` (A parked it) or still ``running`` (A's run is parking it); A's
    release lands right after B's read, and another task of the tenant takes the freed slot.
    B must admit the parent again (the tenant's limit is 1), not run it on the slot its read
    named. Read ``waiting``, B's arrival gives the slot back itself (``_gate.release_parked``);
    read ``running``, only a read after the move to ``queued`` sees the slot gone."""
    dispatcher = _dispatcher(store, queues, registry, limit=1)
    tenant = f"stale-wake-{read_as.value}"
    parent = _submit(store, tenant)
    assert dispatcher.fair.admit(parent, "normal").waits is None
    lease, claimed = store.tasks.claim(parent.task_id, "worker-a", 30)  # type: ignore[misc]
    store.spawns.create(lease, claimed, "toolu_spawn", [], [], 1)
    if read_as is TaskStatus.WAITING:
        store.tasks.transition(parent.task_id, TaskStatus.WAITING, lease=lease)  # A's run returned "waiting"
    other = _submit(store, tenant)
    mark = store.spawns.mark

    def a_parks_and_releases_late(*args: Any, **kwargs: Any) -> Any:
        if store.tasks.get(parent.task_id).status is TaskStatus.RUNNING:
            store.tasks.transition(parent.task_id, TaskStatus.WAITING, lease=lease)  # A's run returns "waiting"
        dispatcher.fair.release(parent.task_id)  # A's release lands now
        assert dispatcher.fair.admit(other, "normal").waits is None  # the freed slot is taken
        assert store.tasks.claim(other.task_id, "worker-c", 30) is not None
        return mark(*args, **kwargs)

    monkeypatch.setattr(store.spawns, "mark", a_parks_and_releases_late)
    ran_holding: list[list[str]] = []
    real_run = dispatcher.engine.run

    def recording_run(task_id: str, **kw: Any) -> Any:
        ran_holding.append(store.tasks.get(task_id).slots)
        return real_run(task_id, **kw)

    monkeypatch.setattr(dispatcher.engine, "run", recording_run)
    body = TaskMessage(task_id=parent.task_id, kind="wake", spawn_id="toolu_spawn").model_dump_json()
    action = dispatcher.handle(body, tier="normal", receive_count=1)

    assert ran_holding == [], f"the parent ran holding {ran_holding} while {other.task_id} held the only slot"
    assert store.tasks.get(parent.task_id).status is TaskStatus.QUEUED and "waits queued" in action.reason
    assert store.slots.with_default(1).usage(tenant).running == 1  # ``other``'s, never two
