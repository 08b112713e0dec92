"""The real Lambda executor handler, fed SQS events built from real messages on moto."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.models import TaskStatus
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_queues, build_registry, build_store, session
from agentq_dev.moto_server import MotoServer

from tests.helpers import call, scripted
from tests.lambda_support import FakeLambdaContext, load_handler, sqs_event


@pytest.fixture
def stack(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Settings, Any]]:
    settings = Settings.for_prefix(
        f"l{uuid.uuid4().hex[:10]}", moto_server.endpoint_url, tool_modules=("tests.effect_tools",)
    )
    provision(
        session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings(max_receive_count=3)
    )
    for key, value in settings.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AGENTQ_SLICE_MARGIN_SECONDS", "1.0")
    monkeypatch.setenv("AGENTQ_LEASE_SECONDS", "5")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "agentq")
    yield settings, load_handler("executor")


def _arn(queues: TaskQueues, tier: str) -> str:
    attrs = queues.sqs.get_queue_attributes(QueueUrl=queues.url(tier), AttributeNames=["QueueArn"])
    return str(attrs["Attributes"]["QueueArn"])


def _invoke_like_lambda(
    handler: Any, queues: TaskQueues, tier: str, timeout_seconds: float
) -> tuple[dict[str, Any], list[str]] | None:
    """Receive one message (batch size 1), invoke, then delete it unless reported failed."""
    resp = queues.sqs.receive_message(
        QueueUrl=queues.url(tier), MaxNumberOfMessages=1, WaitTimeSeconds=1,
        AttributeNames=["All"], MessageAttributeNames=["All"], VisibilityTimeout=30,
    )  # fmt: skip
    messages = resp.get("Messages", [])
    if not messages:
        return None
    result = handler.lambda_handler(sqs_event(messages, _arn(queues, tier)), FakeLambdaContext(timeout_seconds))
    failed = {f["itemIdentifier"] for f in result["batchItemFailures"]}
    for m in messages:
        if m["MessageId"] not in failed:
            queues.delete(tier, m["ReceiptHandle"])
    return result, [m["Body"] for m in messages]


def test_a_task_longer_than_the_time_slice_completes_across_invocations(stack: tuple[Settings, Any]) -> None:
    settings, handler = stack
    store, queues = build_store(settings), build_queues(settings)
    turns = [
        {"text": f"turn {i}", "latency_seconds": 0.4, "tool_calls": [call("lookup", query=str(i))]} for i in range(6)
    ]
    turns.append({"text": "all done"})
    task = submit(store, build_registry(settings), scripted(turns, tools=["lookup"]), tenant="t", queues=queues)

    invocations, kinds = 0, []
    deadline = time.monotonic() + 60
    while not store.tasks.get(task.task_id).status.terminal and time.monotonic() < deadline:
        got = _invoke_like_lambda(handler, queues, "normal", timeout_seconds=2.2)
        if got is None:
            continue
        result, bodies = got
        assert result["batchItemFailures"] == []
        invocations += 1
        kinds += [TaskMessage.model_validate_json(b).kind for b in bodies]

    final = store.tasks.get(task.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "all done"
    assert invocations >= 3  # 7 turns x 0.4 s cannot fit in one 1.2 s slice
    assert kinds[0] == "run" and set(kinds[1:]) == {"continue"}
    assert final.claim_count == invocations  # each invocation resumed where the last stopped
    steps = store.steps.load(task.task_id)
    assert [s.number for s in steps] == list(range(1, 14))
    epochs = [s.epoch for s in steps]
    assert epochs == sorted(epochs) and len(set(epochs)) >= 3  # committed across several slices, in order


def test_a_poison_record_goes_to_the_dlq_and_is_not_reported_as_a_failure(stack: tuple[Settings, Any]) -> None:
    settings, handler = stack
    queues = build_queues(settings)
    queues.sqs.send_message(QueueUrl=queues.url("high"), MessageBody="{not json")
    result, _ = _invoke_like_lambda(handler, queues, "high", timeout_seconds=5)  # type: ignore[misc]
    assert result["batchItemFailures"] == []
    dlq = queues.sqs.receive_message(QueueUrl=queues.dlq_url("high"), MessageAttributeNames=["All"])["Messages"]
    assert dlq[0]["Body"] == "{not json"
    assert dlq[0]["MessageAttributes"]["agentq-reason"]["StringValue"].startswith("poison: not a task message")


def test_a_retryable_failure_is_reported_for_that_record_and_the_message_comes_back_later(
    stack: tuple[Settings, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, handler = stack
    store, queues = build_store(settings), build_queues(settings)
    task = submit(store, build_registry(settings), scripted([{"text": "x"}]), tenant="t", queues=queues)

    class Overloaded:
        name = "overloaded"

        def complete(self, request: Any) -> Any:
            from agentq.core.errors import ProviderError

            raise ProviderError("overloaded", retryable=True, status_code=529, attempts=5)

    rt = handler.runtime()
    monkeypatch.setattr(rt.dispatcher.engine, "providers", lambda sub: Overloaded())
    result, bodies = _invoke_like_lambda(handler, queues, "normal", timeout_seconds=5)  # type: ignore[misc]
    assert len(result["batchItemFailures"]) == 1
    assert json.loads(bodies[0])["task_id"] == task.task_id
    # Backoff: the message is invisible now (not immediately redelivered), the task still runnable.
    assert queues.sqs.receive_message(QueueUrl=queues.url("normal"), WaitTimeSeconds=0).get("Messages") is None
    meta = store.tasks.get(task.task_id)
    assert meta.status is TaskStatus.RUNNING and meta.lease_expires == 0


def test_a_record_with_message_attributes_is_handled_and_dead_lettered_with_them(stack: tuple[Settings, Any]) -> None:
    """Lambda hands message attributes over as a plain mapping (a redriven message carries the DLQ reason)."""
    settings, handler = stack
    queues = build_queues(settings)
    queues.sqs.send_message(
        QueueUrl=queues.url("high"), MessageBody="{not json",
        MessageAttributes={"origin": {"DataType": "String", "StringValue": "redrive"}},
    )  # fmt: skip
    result, _ = _invoke_like_lambda(handler, queues, "high", timeout_seconds=5)  # type: ignore[misc]
    assert result["batchItemFailures"] == []
    dlq = queues.sqs.receive_message(QueueUrl=queues.dlq_url("high"), MessageAttributeNames=["All"])["Messages"]
    assert dlq[0]["MessageAttributes"]["origin"]["StringValue"] == "redrive"
    assert dlq[0]["MessageAttributes"]["agentq-reason"]["StringValue"].startswith("poison: not a task message")


def test_a_poison_record_whose_dead_letter_sqs_refuses_goes_to_the_dlq_as_a_description_and_is_not_reported_failed(
    stack: tuple[Settings, Any],
) -> None:
    """In AWS the reason attribute can push a body near 256 KB over the DLQ's limit (attributes
    count); the DLQ's limit lowered stands for that here. Before, the send's refusal failed the
    record, and the message came back every visibility timeout until SQS moved it, without a
    reason; a description of it goes instead (``TaskQueues.dead_letter``)."""
    settings, handler = stack
    queues = build_queues(settings)
    queues.sqs.set_queue_attributes(QueueUrl=queues.dlq_url("high"), Attributes={"MaximumMessageSize": "1024"})
    queues.sqs.send_message(QueueUrl=queues.url("high"), MessageBody="y" * 1500)
    result, _ = _invoke_like_lambda(handler, queues, "high", timeout_seconds=5)  # type: ignore[misc]
    assert result["batchItemFailures"] == []
    dlq = queues.sqs.receive_message(QueueUrl=queues.dlq_url("high"), MessageAttributeNames=["All"])["Messages"]
    assert json.loads(dlq[0]["Body"])["refused_body"]["bytes"] == 1500
    assert dlq[0]["MessageAttributes"]["agentq-reason"]["StringValue"].startswith("poison: not a task message")
