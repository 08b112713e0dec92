"""Callbacks: a task that names ``notify`` gets its end POSTed, signed with its tenant's secret
(HMAC-SHA256 over a timestamp and the body), through its own queue; a receiver that fails gets
it again later; URLs that are not https or lead inside are refused at submission, naming the
field, with nothing written; a signature that is old, or under another secret, does not verify."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.errors import ValidationError
from agentq.core.models import TaskStatus
from agentq.core.tools import ToolRegistry
from agentq.core.webhooks import SIGNATURE_HEADER, signature, verify
from agentq.resources import WEBHOOK_TIMEOUT_SECONDS
from agentq.runtime import build_registry
from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests.helpers import wait_for
from tests.webhook_receiver import Receiver, Stalling

# Submission checks and the engine need no AWS (the delivery and stack tests below do). ``store`` and ``registry`` (tests/conftest.py) are the in-memory twin's;
# tests that race processes or use queues ask for ``settings`` and build their own.
STORAGE = "memory"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    r = Receiver(fail=1)
    monkeypatch.setenv("AGENTQ_WEBHOOK_ALLOW", f"127.0.0.1:{r.server.server_address[1]}")  # a dev receiver
    yield r
    r.server.shutdown()


def test_a_task_end_is_posted_signed_for_its_tenant_and_a_failed_delivery_is_tried_again(receiver: Receiver) -> None:
    with LocalStack(prefix="hooks", workers=1, api=False) as stack:
        assert stack.settings is not None
        store, queues = stack.store(), stack.queues()
        body = {"goal": "g", "script": {"turns": [{"text": "done"}]}, "metadata": {"order": "42"},
                "notify": {"url": receiver.url}}  # fmt: skip
        task = submit(store, build_registry(stack.settings), body, tenant="acme", queues=queues)
        quiet = submit(store, build_registry(stack.settings), {**body, "notify": {"url": receiver.url,
                       "events": ["failed"]}}, tenant="acme", queues=queues)  # fmt: skip
        wait_for(lambda: len([r for r in receiver.received if r[2] == 204]) >= 1, timeout=60, what="a delivery")
        secret = store.webhook_secrets.get_or_create("acme")
        assert store.tasks.get(quiet.task_id).status is TaskStatus.SUCCEEDED

    headers, raw, _ = receiver.received[-1]
    assert [status for *_, status in receiver.received] == [500, 204]  # the first try failed; the second came later
    assert receiver.received[0][1] == raw and receiver.received[0][0]["agentq-delivery"] == headers["agentq-delivery"]
    payload = json.loads(raw)
    assert payload == {"type": "task.ended", "task_id": task.task_id, "tenant": "acme", "user": None,
                       "status": "succeeded", "root_id": task.task_id, "metadata": {"order": "42"}}  # fmt: skip
    assert verify(secret, headers[SIGNATURE_HEADER], raw)
    assert not verify("whsec_another", headers[SIGNATURE_HEADER], raw)
    assert not verify(secret, headers[SIGNATURE_HEADER], raw + b" ")
    assert not verify(secret, signature(secret, raw, int(time.time()) - 600), raw)  # a replay, ten minutes on
    assert all(json.loads(b)["task_id"] != quiet.task_id for _, b, _ in receiver.received)  # not subscribed


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://example.com/hook", "https:// URLs only"),
        ("https://127.0.0.1/hook", "loopback"),
        ("https://169.254.169.254/latest", "metadata"),
        ("https://10.1.2.3/x", "private"),
        ("ftp://example.com/x", "https:// URLs only"),
        ("https://localhost:8443/x", "loopback"),
    ],
)
def test_a_callback_url_that_is_not_https_or_leads_inside_is_refused_naming_the_field(
    url: str, says: str, store: Storage, registry: ToolRegistry
) -> None:
    body = {"goal": "g", "script": {"turns": [{"text": "x"}]}, "notify": {"url": url}}
    with pytest.raises(ValidationError) as refused:
        submit(store, registry, body, tenant="acme")
    assert refused.value.field == "notify.url" and says in str(refused.value), str(refused.value)
    assert list(store.tasks.live_task_ids()) == []


def test_a_receiver_that_answers_a_byte_at_a_time_is_cut_off_at_the_posts_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A callback's URL is its tenant's: a receiver that drips its answer, each read well inside
    a socket timeout, must not hold a delivery past ``TIMEOUT_SECONDS`` for the whole post. That
    bound is what the Lambda deliverer's batch is sized by (functions/webhooks)."""
    from agentq.core import webhooks
    from agentq.core.webhooks import Delivery, post

    stalling = Stalling(drip=0.2, for_seconds=4.0)
    try:
        monkeypatch.setattr(webhooks, "TIMEOUT_SECONDS", 1.0)
        monkeypatch.setenv("AGENTQ_WEBHOOK_ALLOW", stalling.allow)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"within 1\.0 s"):
            post(Delivery.for_task_end("acme", stalling.url, {"task_id": "t"}, finished_at=1.0), "whsec_test")
        elapsed = time.monotonic() - started
    finally:
        stalling.close()
    assert elapsed < 2.0, f"the post took {elapsed:.1f} s"


def test_the_lambda_deliverer_posts_reports_a_failed_try_and_dead_letters_a_refused_url(
    moto_server: Any, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentq.core.webhooks import Delivery
    from agentq.runtime import build_queues, build_store

    from tests.helpers import deployment, queue_depth
    from tests.lambda_support import FakeLambdaContext, load_handler, sqs_event

    settings = deployment(moto_server)
    for key, value in settings.env().items():
        monkeypatch.setenv(key, value)
    store, queues = build_store(settings), build_queues(settings)
    good = Delivery.for_task_end("acme", receiver.url, {"task_id": "t1", "status": "succeeded"}, finished_at=1.0)
    refused = Delivery.for_task_end(
        "acme", "https://10.0.0.1/hook", {"task_id": "t2", "status": "failed"}, finished_at=1.0
    )
    for delivery in (good, good, refused):  # the receiver fails the first post of the good one
        queues.send_webhook(delivery.to_json())
    got = queues.sqs.receive_message(QueueUrl=queues.webhooks_url(), MaxNumberOfMessages=10,
                                     MessageSystemAttributeNames=["All"])["Messages"]  # fmt: skip
    handler = load_handler("webhooks")
    arn = queues.sqs.get_queue_attributes(QueueUrl=queues.webhooks_url(), AttributeNames=["QueueArn"])
    result = handler.lambda_handler(
        sqs_event(got, arn["Attributes"]["QueueArn"]), FakeLambdaContext(WEBHOOK_TIMEOUT_SECONDS)
    )
    assert len(result["batchItemFailures"]) == 1  # one post of the good delivery failed: tried again later
    assert [status for *_, status in receiver.received] == [500, 204]
    assert verify(store.webhook_secrets.get_or_create("acme"), receiver.received[1][0][SIGNATURE_HEADER],
                  receiver.received[1][1])  # fmt: skip
    dead = queues.sqs.receive_message(QueueUrl=queues.webhooks_dlq_url(), MessageAttributeNames=["All"])["Messages"]
    assert json.loads(dead[0]["Body"])["payload"]["task_id"] == "t2"
    assert "private" in dead[0]["MessageAttributes"]["agentq-reason"]["StringValue"]
    assert queue_depth(queues, queues.webhooks_dlq_url()) == 1


def test_the_lambda_deliverer_starts_no_delivery_it_may_not_finish_and_hands_the_rest_back_untouched(
    moto_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each delivery may take ``longest_delivery_seconds``: one begun without that much of the
    invocation left could be cut off by Lambda, which returns the *whole* batch (the delivered
    callbacks posted again, every record spending one of its attempts). So the deliverer stops
    first, and reports the records it did not start as failures, never posted. Scaled down:
    each post 1 s, a 2.5 s invocation, a batch of one good receiver and three that never answer."""
    from agentq.core import webhooks as core_webhooks
    from agentq.core.webhooks import Delivery
    from agentq.queueing import webhooks as queueing_webhooks
    from agentq.runtime import build_queues

    from tests.helpers import deployment
    from tests.lambda_support import FakeLambdaContext, load_handler, sqs_event

    stalling, good = Stalling(), Receiver()
    budget = 2.5
    try:
        monkeypatch.setattr(core_webhooks, "TIMEOUT_SECONDS", 1.0)
        monkeypatch.setattr(core_webhooks, "RESOLVE_SECONDS", 0.5)
        monkeypatch.setattr(queueing_webhooks, "DELIVERY_MARGIN_SECONDS", 0.1)  # each needs 1.6 s left
        monkeypatch.setenv("AGENTQ_WEBHOOK_ALLOW", f"{stalling.allow},127.0.0.1:{good.server.server_address[1]}")
        settings = deployment(moto_server)
        for key, value in settings.env().items():
            monkeypatch.setenv(key, value)
        queues = build_queues(settings)
        urls = {"0-good": good.url, "1-stalls": stalling.url, "2-stalls": stalling.url, "3-stalls": stalling.url}
        for name, url in urls.items():
            queues.send_webhook(Delivery.for_task_end("acme", url, {"task_id": name}, finished_at=1.0).to_json())
        got = queues.sqs.receive_message(QueueUrl=queues.webhooks_url(), MaxNumberOfMessages=10,
                                         MessageSystemAttributeNames=["All"])["Messages"]  # fmt: skip
        got.sort(key=lambda m: json.loads(m["Body"])["payload"]["task_id"])
        ids = [m["MessageId"] for m in got]
        arn = queues.sqs.get_queue_attributes(QueueUrl=queues.webhooks_url(), AttributeNames=["QueueArn"])
        handler = load_handler("webhooks")
        started = time.monotonic()
        result = handler.lambda_handler(sqs_event(got, arn["Attributes"]["QueueArn"]), FakeLambdaContext(budget))
        elapsed = time.monotonic() - started
    finally:
        stalling.close()
        good.server.shutdown()
    assert elapsed < budget, f"the handler ran {elapsed:.1f} s of a {budget} s invocation: Lambda would end it"
    assert [status for *_, status in good.received] == [204]  # delivered once, and not handed back
    assert [f["itemIdentifier"] for f in result["batchItemFailures"]] == ids[1:]
    assert stalling.connections == 1  # the first that stalls was tried; the two after it never posted


# Bodies no attempt can deliver, and what the DLQ's reason says of each.
NOT_DELIVERIES = {
    "[]": "a JSON array, not an object",
    "null": "a JSON null, not an object",
    "5": "a JSON number, not an object",
    "{": "Expecting property name",
    '{"delivery_id": "d", "tenant": "acme", "url": "https://x.example", "payload": 5}': "payload must be an object",
    '{"delivery_id": "d", "url": "https://x.example", "payload": {}}': "tenant is missing",
}


def _bad_and_good_deliveries(moto_server: Any, monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> Any:
    """A webhooks queue holding every body of NOT_DELIVERIES and one good delivery after them."""
    from agentq.core.webhooks import Delivery
    from agentq.runtime import build_queues

    from tests.helpers import deployment

    monkeypatch.setenv("AGENTQ_WEBHOOK_ALLOW", f"127.0.0.1:{receiver.server.server_address[1]}")  # a dev receiver
    settings = deployment(moto_server)
    for key, value in settings.env().items():
        monkeypatch.setenv(key, value)
    queues = build_queues(settings)
    for body in NOT_DELIVERIES:
        queues.send_webhook(body)
    queues.send_webhook(
        Delivery.for_task_end("acme", receiver.url, {"task_id": "t1", "status": "succeeded"}, finished_at=1.0).to_json()
    )
    return settings, queues


def _dead_letters_with_reasons(queues: Any) -> dict[str, str]:
    from tests.helpers import queue_depth

    assert queue_depth(queues, queues.webhooks_url()) == 0  # nothing left to retry
    dead: dict[str, str] = {}
    while got := queues.sqs.receive_message(QueueUrl=queues.webhooks_dlq_url(), MaxNumberOfMessages=10,
                                            MessageAttributeNames=["All"]).get("Messages"):  # fmt: skip
        for m in got:
            dead[m["Body"]] = m["MessageAttributes"]["agentq-reason"]["StringValue"]
            queues.sqs.delete_message(QueueUrl=queues.webhooks_dlq_url(), ReceiptHandle=m["ReceiptHandle"])
    return dead


def test_the_lambda_deliverer_dead_letters_a_body_that_is_not_a_delivery_with_the_reason_and_delivers_the_rest(
    moto_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.lambda_support import FakeLambdaContext, load_handler, sqs_event

    receiver = Receiver()
    try:
        _, queues = _bad_and_good_deliveries(moto_server, monkeypatch, receiver)
        got = queues.sqs.receive_message(QueueUrl=queues.webhooks_url(), MaxNumberOfMessages=10,
                                         MessageSystemAttributeNames=["All"])["Messages"]  # fmt: skip
        assert len(got) == len(NOT_DELIVERIES) + 1
        arn = queues.sqs.get_queue_attributes(QueueUrl=queues.webhooks_url(), AttributeNames=["QueueArn"])
        handler = load_handler("webhooks")
        result = handler.lambda_handler(
            sqs_event(got, arn["Attributes"]["QueueArn"]), FakeLambdaContext(WEBHOOK_TIMEOUT_SECONDS)
        )
        assert result["batchItemFailures"] == []  # none to try again: not the whole batch
        for m in got:  # what the event source does with a batch that reported no failures
            queues.sqs.delete_message(QueueUrl=queues.webhooks_url(), ReceiptHandle=m["ReceiptHandle"])
        assert [status for *_, status in receiver.received] == [204]
        dead = _dead_letters_with_reasons(queues)
    finally:
        receiver.server.shutdown()
    assert set(dead) == set(NOT_DELIVERIES)
    for body, says in NOT_DELIVERIES.items():
        assert says in dead[body], (body, dead[body])


def test_the_local_deliverer_dead_letters_a_body_that_is_not_a_delivery_with_the_reason_and_delivers_the_rest(
    moto_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from agentq.queueing.webhooks import delivery_loop
    from agentq.runtime import build_store

    from tests.helpers import queue_depth

    receiver = Receiver()
    stop = threading.Event()
    try:
        settings, queues = _bad_and_good_deliveries(moto_server, monkeypatch, receiver)
        loop = threading.Thread(target=delivery_loop, args=(build_store(settings), queues, stop), daemon=True)
        loop.start()
        wait_for(lambda: receiver.received, timeout=30, what="the good delivery")
        wait_for(lambda: queue_depth(queues, queues.webhooks_url()) == 0, timeout=30, what="every message handled")
        stop.set()
        loop.join(10)
        dead = _dead_letters_with_reasons(queues)
    finally:
        stop.set()
        receiver.server.shutdown()
    assert [status for *_, status in receiver.received] == [204]  # delivered the first time, not after a retry
    assert set(dead) == set(NOT_DELIVERIES)
    for body, says in NOT_DELIVERIES.items():
        assert says in dead[body], (body, dead[body])


def test_an_agent_can_name_the_callback_of_its_tasks_and_a_submission_its_own(
    store: Storage, registry: ToolRegistry
) -> None:
    from agentq.control.agents import create_agent

    agent = {"name": "reporter", "provider": "scripted", "script": {"turns": [{"text": "r"}]},
             "notify": {"url": "https://hooks.example.com/agentq", "events": ["failed"]}}  # fmt: skip
    create_agent(store, registry, agent, tenant="acme")
    inherited = submit(store, registry, {"agent": "reporter", "goal": "g"}, tenant="acme")
    assert inherited.submission.notify is not None and inherited.submission.notify.events == ["failed"]
    own = submit(store, registry, {"agent": "reporter", "goal": "g", "notify": {"url": "https://mine.example.com/"}},
                 tenant="acme")  # fmt: skip
    assert own.submission.notify is not None and own.submission.notify.url == "https://mine.example.com/"
    with pytest.raises(ValidationError) as refused:
        create_agent(store, registry, {**agent, "name": "bad", "notify": {"url": "http://hooks.example.com/"}},
                     tenant="acme")  # fmt: skip
    assert refused.value.field == "notify.url"
