"""Failures a person can see: on moto server, a worker (the real dispatcher and engine) runs tasks
against the local Messages API server through the real anthropic SDK.

A failure no retry can fix (no key, a key refused, no permission, an unknown model, a request
the API rejects, replies that are never a Message) ends the task ``failed`` at once with a
precise code, its message deleted, not dead-lettered. While a retryable failure is being
retried, the task's status (the API's view, ``agentq status``, ``agentq watch``) and its trace
say which attempt failed, how, and when the next one is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import pytest

from agentq.api import views as api_views
from agentq.api.models import LLMCallEvent, TaskView, TransitionEvent
from agentq.cli.views import event_line, status_block, watch_view
from agentq.control.submit import submit
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.core.providers import ProviderFactory, default_provider_factory
from agentq.core.providers.anthropic_provider import AnthropicProvider
from agentq.core.providers.retry import RetryPolicy
from agentq.queueing.dispatch import Action, RetryBackoff
from agentq.runtime import Settings, build_queues, build_registry, build_store
from agentq.storage.container import Storage
from agentq.worker import Worker, WorkerConfig
from agentq_dev.moto_server import MotoServer

from tests.fake_messages_api import (
    FakeMessagesAPI,
    FakeReply,
    authentication_error,
    invalid_request,
    malformed_json,
    model_not_found,
    overloaded,
    permission_denied,
    text_reply,
    wrong_shape,
)
from tests.helpers import deployment, wait_for

TIER: Literal["high"] = "high"
MODEL = "claude-sonnet-4-6"


def _submission() -> TaskSubmission:
    return TaskSubmission(goal="answer", provider="anthropic", model=MODEL, priority=TIER)


@contextmanager
def _worker(
    settings: Settings, providers: ProviderFactory, *, max_receive_count: int = 3, backoff_seconds: float = 1
) -> Iterator[list[Action]]:
    """A running worker whose engine uses ``providers``; yields the actions it applies."""
    config = WorkerConfig(
        concurrency=4, lease_seconds=3, heartbeat_seconds=1, visibility_seconds=10, max_receive_count=max_receive_count
    )
    engine = Engine(
        build_store(settings),
        worker_id="visible-failures",
        tools=build_registry(settings),
        providers=providers,
        config=EngineConfig(lease_seconds=config.lease_seconds, heartbeat_seconds=config.heartbeat_seconds),
    )
    worker = Worker(settings, config, engine=engine)
    worker.dispatcher.backoff = RetryBackoff(base_seconds=backoff_seconds, cap_seconds=backoff_seconds)
    applied: list[Action] = []
    apply = worker._apply

    def recording(tier: str, message: dict[str, Any], action: Action) -> None:
        applied.append(action)
        apply(tier, message, action)

    worker._apply = recording  # type: ignore[method-assign]
    worker.start()
    try:
        yield applied
    finally:
        worker.shutdown()


def _sdk(fake: FakeMessagesAPI, policy: RetryPolicy) -> ProviderFactory:
    return lambda submission: AnthropicProvider(api_key="sk-ant-test", base_url=fake.base_url, retry=policy)


def _ended(store: Storage, task_id: str, timeout: float = 30) -> Any:
    return wait_for(lambda: (t := store.tasks.get(task_id)).status.terminal and t, timeout, f"task {task_id} ended")


def _dlq_depth(settings: Settings) -> int:
    queues = build_queues(settings)
    attrs = queues.sqs.get_queue_attributes(QueueUrl=queues.dlq_url(TIER), AttributeNames=["All"])["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


# ------------------------------------------------------------- failures no retry fixes


def test_without_an_anthropic_key_the_task_fails_at_once_saying_so(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = deployment(moto_server)
    store = build_store(settings)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with FakeMessagesAPI() as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)  # were a call made, it would land here
        with _worker(settings, default_provider_factory) as applied:
            task = submit(store, build_registry(settings), _submission(), tenant="t", queues=build_queues(settings))
            failed = _ended(store, task.task_id)
        assert fake.requests == []
    assert failed.status is TaskStatus.FAILED and failed.claim_count == 1
    assert failed.error["code"] == "missing_api_key" and "ANTHROPIC_API_KEY" in failed.error["message"]
    assert [a.kind for a in applied] == ["delete"] and _dlq_depth(settings) == 0
    assert store.budgets.get(task.task_id).reserved == 0


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (authentication_error(), "invalid_api_key"),
        (permission_denied(), "permission_denied"),
        (model_not_found(MODEL), "model_not_found"),
        (invalid_request("messages: roles must alternate"), "invalid_request"),
    ],
    ids=["401", "403", "404", "400"],
)
def test_a_request_the_model_api_refuses_fails_the_task_at_once_with_a_precise_code(
    moto_server: MotoServer, reply: FakeReply, code: str
) -> None:
    settings = deployment(moto_server)
    store = build_store(settings)
    with FakeMessagesAPI() as fake:
        fake.enqueue(reply)
        with _worker(settings, _sdk(fake, RetryPolicy(max_attempts=5))) as applied:
            task = submit(store, build_registry(settings), _submission(), tenant="t", queues=build_queues(settings))
            failed = _ended(store, task.task_id)
        assert len(fake.requests) == 1  # not retried by the worker...
    assert [a.kind for a in applied] == ["delete"] and _dlq_depth(settings) == 0  # ...nor by the queue
    assert failed.status is TaskStatus.FAILED and failed.claim_count == 1
    assert failed.error["code"] == code and failed.error["status_code"] == reply.status
    assert reply.body["error"]["message"] in failed.error["message"]  # type: ignore[index,call-overload]


def test_replies_that_are_never_a_message_are_retried_a_few_times_then_fail_the_task(moto_server: MotoServer) -> None:
    settings = deployment(moto_server)
    store = build_store(settings)
    with FakeMessagesAPI() as fake:
        fake.enqueue(malformed_json(), wrong_shape(), malformed_json())
        policy = RetryPolicy(max_attempts=3, base_delay=0.05, max_delay=0.05)
        with _worker(settings, _sdk(fake, policy)) as applied:
            task = submit(store, build_registry(settings), _submission(), tenant="t", queues=build_queues(settings))
            failed = _ended(store, task.task_id)
        assert len(fake.requests) == 3 and fake.pending == 0
    assert failed.status is TaskStatus.FAILED and failed.error["code"] == "malformed_response"
    assert "carried no message, where an event stream was asked" in failed.error["message"]  # every call streams
    assert failed.error["attempts"] == 3
    assert [a.kind for a in applied] == ["delete"]
    assert store.budgets.get(task.task_id).reserved == 0 and failed.tokens_in == 0  # nothing charged for garbage


# ------------------------------------------------------------------- retries you can see


def _view(store: Storage, task_id: str) -> TaskView:
    """What GET /tasks/{id} answers (and agentq status / watch draw)."""
    return TaskView.model_validate_json(api_views.task_view(store, store.tasks.get(task_id)).model_dump_json())


def _until_view(store: Storage, task_id: str, pred: Callable[[TaskView], bool], what: str) -> TaskView:
    def ready() -> TaskView | None:
        view = _view(store, task_id)
        return view if pred(view) else None

    return wait_for(ready, 30, what, interval=0.02)  # type: ignore[no-any-return]


def test_while_the_worker_retries_the_model_call_status_and_trace_show_the_attempt_error_and_next_try(
    moto_server: MotoServer,
) -> None:
    settings = deployment(moto_server)
    store = build_store(settings)
    with FakeMessagesAPI() as fake:
        fake.enqueue(overloaded(), overloaded(), text_reply("made it"))
        policy = RetryPolicy(max_attempts=3, base_delay=1.5, max_delay=3, jitter="none")
        with _worker(settings, _sdk(fake, policy)):
            task = submit(store, build_registry(settings), _submission(), tenant="t", queues=build_queues(settings))
            first = _until_view(store, task.task_id, lambda v: v.retry is not None, "the first retry shown")
            second = _until_view(
                store, task.task_id, lambda v: v.retry is not None and v.retry.attempt == 2, "the second retry"
            )
            done = _ended(store, task.task_id)

    assert first.status is TaskStatus.RUNNING and first.retry is not None
    r = first.retry
    assert (r.scope, r.attempt, r.max_attempts) == ("call", 1, 3)
    assert r.error == {"code": "overloaded", "message": "anthropic overloaded (529): Overloaded", "status_code": 529}
    assert r.next_attempt_at == pytest.approx(r.failed_at + 1.5, abs=0.01)
    assert first.activity is not None and first.activity.startswith(
        "retrying the model call: attempt 1 of 3 failed (overloaded: anthropic overloaded (529): Overloaded)"
    )
    assert "retry     model call attempt 1 of 3 failed: overloaded HTTP 529" in status_block(first)
    assert "attempt 1 of 3 failed" in _rendered(watch_view(first, []))
    assert second.retry is not None and second.retry.next_attempt_at == pytest.approx(
        second.retry.failed_at + 3.0, abs=0.01
    )

    assert done.status is TaskStatus.SUCCEEDED and done.result == "made it"
    final = _view(store, task.task_id)
    assert final.retry is None and final.activity is None  # history now: the trace keeps it
    events = api_views.trace_page(store, store.tasks.get(task.task_id), limit=50, cursor=None).events
    retries = [e for e in events if isinstance(e, TransitionEvent) and e.event == "retry_scheduled"]
    assert len(retries) == 1 and retries[0].detail["attempt"] == 2 and retries[0].detail["scope"] == "call"
    line = event_line(retries[0], 0).plain  # what agentq trace prints
    assert "retry: model call attempt 2 of 3 failed: overloaded HTTP 529" in line
    assert [e.attempts for e in events if isinstance(e, LLMCallEvent)] == [3]


def test_while_the_queue_redelivers_a_task_its_status_shows_the_delivery_error_and_next_try(
    moto_server: MotoServer,
) -> None:
    settings = deployment(moto_server, max_receive_count=3)
    store = build_store(settings)
    with FakeMessagesAPI() as fake:
        fake.enqueue(overloaded(), text_reply("second time lucky"))
        with _worker(settings, _sdk(fake, RetryPolicy(max_attempts=1)), backoff_seconds=2) as applied:
            task = submit(store, build_registry(settings), _submission(), tenant="t", queues=build_queues(settings))
            waiting = _until_view(store, task.task_id, lambda v: v.retry is not None, "the redelivery shown")
            done = _ended(store, task.task_id)

    assert waiting.retry is not None
    r = waiting.retry
    assert (r.scope, r.attempt, r.max_attempts, r.error["code"]) == ("delivery", 1, 3, "overloaded")
    assert 1 <= r.next_attempt_at - r.failed_at <= 2  # the backoff: full jitter over [1, 2], whole seconds
    assert waiting.error is None and waiting.activity is not None and waiting.activity.startswith("retrying the task")
    assert [a.kind for a in applied] == ["retry", "delete"]
    assert done.status is TaskStatus.SUCCEEDED and _view(store, task.task_id).retry is None


def _rendered(renderable: Any) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()
