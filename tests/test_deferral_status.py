"""A task put off before its call says so: the open circuit (or the rate limit) by name, and a
next try in the future, where status used to show an older retry whose time had passed."""

from __future__ import annotations

from agentq.api.views import task_view
from agentq.cli.views import status_block
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.queueing.queues import TaskMessage
from agentq.runtime import build_dispatcher, build_queues, build_registry, build_store
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment


def test_a_task_deferred_by_an_open_circuit_names_the_circuit_and_a_next_try_ahead(moto_server: MotoServer) -> None:
    settings = deployment(moto_server)
    store, queues = build_store(settings), build_queues(settings)
    key = "anthropic/claude-sonnet-4-6"
    while not store.flow.failed(key, store.flow.admit(key, 10, 10)):  # the fleet's calls keep failing
        pass
    task = store.tasks.create(
        TaskSubmission.model_validate({"goal": "g", "provider": "anthropic", "model": "claude-sonnet-4-6"}), tenant="t"
    )

    engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
    dispatcher = build_dispatcher(engine, store, queues, max_receive_count=5)
    action = dispatcher.handle(TaskMessage(task_id=task.task_id).model_dump_json(), tier="normal", receive_count=1)

    assert action.kind == "delete" and "circuit" in action.reason and "open" in action.reason
    view = task_view(store, store.tasks.get(task.task_id))
    assert view.status is TaskStatus.RUNNING and view.retry is not None
    assert view.retry.scope == "deferral" and view.retry.error["code"] == "circuit_open"
    assert view.retry.next_attempt_at > view.retry.failed_at  # ahead, never in the past when written
    assert view.activity == (
        "deferred before its next call (circuit_open): the circuit for anthropic/claude-sonnet-4-6 is open after "
        "repeated failures"
    )
    shown = status_block(view)
    assert "deferred: circuit_open: the circuit for anthropic/claude-sonnet-4-6 is open" in shown
    assert "(in " in shown and "attempt" not in shown
