"""Every status change goes to the EventBridge bus (``TaskStatusChanged``), as the stack wires
it: here a bus on moto server with a rule that forwards agentq's events to an SQS queue."""

from __future__ import annotations

import json
import uuid
from typing import Any

import boto3
import pytest

from agentq.control.submit import submit
from agentq.core.engine import Engine
from agentq.core.models import TaskStatus
from agentq.core.tools import ToolRegistry
from agentq.observe import events
from agentq.storage.container import Storage
from agentq_dev.moto_server import MotoServer


def _forwarded(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    """A bus whose agentq events land in a queue; the process sends to it."""
    bus = f"agentq-{uuid.uuid4().hex[:8]}-events"
    endpoint = moto_server.endpoint_url
    eventbridge = boto3.client("events", endpoint_url=endpoint, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
    eventbridge.create_event_bus(Name=bus)
    url = sqs.create_queue(QueueName=f"{bus}-sink")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    eventbridge.put_rule(Name="all", EventBusName=bus, EventPattern=json.dumps({"source": ["agentq"]}))
    eventbridge.put_targets(Rule="all", EventBusName=bus, Targets=[{"Id": "sink", "Arn": arn}])
    monkeypatch.setenv("AGENTQ_EVENT_BUS", bus)
    monkeypatch.setenv("AWS_ENDPOINT_URL_EVENTBRIDGE", moto_server.endpoint_url)
    monkeypatch.setattr(events, "_client", None)  # made again, for this endpoint
    return sqs, url


def _received(sqs: Any, url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not batch:
            return out
        out += [json.loads(m["Body"]) for m in batch]


def test_each_status_change_of_a_task_is_an_event_on_the_bus(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, store: Storage, registry: ToolRegistry
) -> None:
    sqs, url = _forwarded(moto_server, monkeypatch)
    body = {"goal": "g", "script": {"turns": [{"text": "done"}]}}
    task = submit(store, registry, body, tenant="acme")
    assert Engine(store, worker_id="w", tools=registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    cancelled = submit(store, registry, body, tenant="acme")
    from agentq.control.operations import cancel

    cancel(store, cancelled.task_id)

    got = _received(sqs, url)
    assert {e["detail-type"] for e in got} == {"TaskStatusChanged"} and {e["source"] for e in got} == {"agentq"}
    by_task: dict[str, list[str]] = {}
    for event in sorted(got, key=lambda e: e["detail"]["at"]):
        assert event["detail"]["tenant"] == "acme"
        by_task.setdefault(event["detail"]["task_id"], []).append(event["detail"]["status"])
    assert by_task[task.task_id] == ["queued", "running", "succeeded"]
    assert by_task[cancelled.task_id] == ["queued", "cancelled"]


def test_a_bus_that_cannot_be_reached_never_fails_the_task(
    monkeypatch: pytest.MonkeyPatch, store: Storage, registry: ToolRegistry
) -> None:
    monkeypatch.setenv("AGENTQ_EVENT_BUS", "no-such-bus")
    monkeypatch.setenv("AWS_ENDPOINT_URL_EVENTBRIDGE", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(events, "_client", None)
    task = submit(store, registry, {"goal": "g", "script": {"turns": [{"text": "done"}]}}, tenant="acme")
    assert Engine(store, worker_id="w", tools=registry).run(task.task_id).status is TaskStatus.SUCCEEDED
