"""Every unfinished task has a way forward, and DLQs hold only what really failed (issue 12.3),
against moto server: receives spent by worker faults never dead-letter a healthy task (the
task's own failures are counted on META, a message whose receives ran past the allowance is
renewed); a duplicate of a finished task's message is deleted; a task left with no message at
all is swept back into its queue. Under random SIGKILL and SIGSTOP of real worker processes
(every task ends, none in a DLQ): tests/test_chaos.py."""

from __future__ import annotations

from typing import Any

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus
from agentq.queueing.dispatch import Dispatcher
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.queueing.sweeper import sweep
from agentq.runtime import build_dispatcher, build_queues, build_registry, build_store
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, queue_depth, scripted

MAX_RECEIVES = 2
TIER = "normal"


def _dispatcher(moto_server: MotoServer) -> tuple[Any, Any, TaskQueues, Dispatcher]:
    settings = deployment(moto_server, max_receive_count=MAX_RECEIVES)
    store, queues = build_store(settings), build_queues(settings)
    engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
    return settings, store, queues, build_dispatcher(engine, store, queues, max_receive_count=MAX_RECEIVES)


def test_a_message_whose_receives_went_to_worker_faults_is_renewed_not_dead_lettered(moto_server: MotoServer) -> None:
    _, store, queues, dispatcher = _dispatcher(moto_server)
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    body = TaskMessage(task_id=task.task_id).model_dump_json()
    action = dispatcher.handle(body, tier=TIER, receive_count=MAX_RECEIVES + 1)
    assert action.kind == "delete" and action.reason.startswith("renewed")
    [fresh] = queues.sqs.receive_message(QueueUrl=queues.url(TIER), WaitTimeSeconds=1)["Messages"]
    assert fresh["Body"] == TaskMessage.model_validate_json(body).model_dump_json(exclude_defaults=True)
    assert store.tasks.get(task.task_id).status is TaskStatus.QUEUED  # untouched: the fresh copy runs it
    assert queue_depth(queues, queues.dlq_url(TIER)) == 0


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
    assert queue_depth(queues, queues.url(TIER)) == 0 and queue_depth(queues, queues.dlq_url(TIER)) == 0


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


def test_a_stranded_task_is_swept_once_while_its_swept_message_is_on_its_way(moto_server: MotoServer) -> None:
    """A sweep notes on META when it re-enqueued a task (``swept_at``, before it sends), and the
    task's silence counts from then: the next pass (or an overlapping scheduled run) sends no
    second ``swept`` message while the first still waits in a backlog, as a lost look is sent
    once (``next_look``). Each pass sent another before. One whose swept message was lost too is
    swept again once it has been silent that long since."""
    _, store, queues, _ = _dispatcher(moto_server)
    stranded = store.tasks.create(scripted([{"text": "done"}]), tenant="t")  # no message was ever sent
    now = store.tasks.get(stranded.task_id).updated_at
    assert sweep(store, queues, stale_after=60, now=now + 61).swept == [stranded.task_id]
    assert sweep(store, queues, stale_after=60, now=now + 62).swept == []
    assert queue_depth(queues, queues.url(TIER)) == 1
    # Two sweeps that listed it with the same mark: only the first to write it sends.
    assert not store.tasks.mark_swept(stranded.task_id, now + 63, after=None)
    assert sweep(store, queues, stale_after=60, now=now + 61 + 60).swept == [stranded.task_id]  # that one was lost
    assert queue_depth(queues, queues.url(TIER)) == 2
