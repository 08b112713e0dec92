"""A worker process that dies after its task's run ended but before the dispatcher did what
follows a run (reported the end to a fan-out parent through its callback token, queued its
callback, looked at its dependents, gave back its slots) leaves its task owned, so a peer's
recovery makes its message visible again and the redelivery does those things within seconds.
Disowned at the run's end, the ended task's message stayed invisible for the claimed
``held_visibility_seconds`` (10 minutes): in the chaos suite a fan-out parent whose children
had all ended stayed ``waiting`` that long.

The engine runs on the in-memory twin; the tier queue is real SQS on moto server (the
redelivery is a message)."""

from __future__ import annotations

from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.queueing.recovery import recover
from agentq.runtime import build_queues
from agentq.storage.container import Storage
from agentq.worker import HeartbeatHub, WorkerConfig
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, scripted

STORAGE = "memory"
WORKER = "dying-worker"


@pytest.fixture(scope="module")
def queues(moto_server: MotoServer) -> TaskQueues:
    return build_queues(deployment(moto_server))


def _receive(queues: TaskQueues, visibility: int) -> list[dict[str, Any]]:
    got = queues.sqs.receive_message(
        QueueUrl=queues.url("normal"), MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=visibility
    )
    return list(got.get("Messages", []))


def test_a_task_that_ended_under_a_worker_that_died_before_reporting_it_is_handed_on_at_once(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    queues.send(task.task_id, "normal", tenant="t")
    config = WorkerConfig()
    (message,) = _receive(queues, config.held_visibility_seconds)  # as the hub keeps a claimed task's
    hub = HeartbeatHub(store, queues, config, WORKER)
    hub.life = store.tasks.workers.start(WORKER, config.lease_seconds)  # its liveness; no heartbeat thread
    engine = Engine(store, worker_id=WORKER, tools=registry, config=EngineConfig(lease_seconds=30))
    with hub.hold("normal", message["ReceiptHandle"]) as held:
        run = engine.run(task.task_id, keeper=lambda state: hub.track(held, state), owner=hub.owner(held))
        assert run.status is TaskStatus.SUCCEEDED
        # The process dies here: the run is over, nothing after it was done, the message is not deleted.
        assert [m["task_id"] for m in store.tasks.owned_by(WORKER)] == [task.task_id]
        (peer,) = [p for p in store.tasks.workers.peers() if p.worker == WORKER]
        assert recover(store, queues, peer) == [task.task_id]
        (again,) = _receive(queues, 30)  # visible again at once, not in 10 minutes
        assert TaskMessage.model_validate_json(again["Body"]).task_id == task.task_id


def test_a_task_whose_message_was_let_go_leaves_its_workers_index(
    store: Storage, queues: TaskQueues, registry: Any
) -> None:
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    hub = HeartbeatHub(store, queues, WorkerConfig(), WORKER)
    hub.life = store.tasks.workers.start(WORKER, 3.0)
    engine = Engine(store, worker_id=WORKER, tools=registry, config=EngineConfig(lease_seconds=30))
    with hub.hold("normal", "receipt") as held:
        engine.run(task.task_id, keeper=lambda state: hub.track(held, state), owner=hub.owner(held))
    assert store.tasks.owned_by(WORKER) == []
