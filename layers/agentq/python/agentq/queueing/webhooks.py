"""Delivering callbacks: a task that ended with a subscribed status (``notify``) gets one
message on the webhooks queue; a deliverer (a Lambda on that queue in AWS, a thread in the
local stack) POSTs it, signed (``core.webhooks``). A receiver that answers non-2xx, or cannot be
reached, gets it again later (the message's visibility grows with each receive), up to
``WEBHOOK_ATTEMPTS``; then SQS moves it to the webhooks DLQ. A URL that is refused (it now
resolves inside) is not retried: it goes to the DLQ at once, with the reason.

A callback names the end user its task acts for (``user``; null for none) beside ``metadata``:
an end user's token may set its task's metadata, so a receiver that must know whose task ended
reads ``user``, which only the API's authentication sets, never ``metadata``."""

from __future__ import annotations

import logging
import threading
from typing import Any

from agentq.core.models import Task, TaskStatus
from agentq.core.tools.fetch import FetchRefused
from agentq.core.webhooks import Delivery, longest_delivery_seconds, post
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage

log = logging.getLogger("agentq.webhooks")


class DeliveryFailed(Exception):
    """The receiver did not take it (non-2xx, unreachable): try again later."""


def enqueue_end(store: Storage, queues: TaskQueues | None, task: Task, status: TaskStatus) -> bool:
    """Queue the callback of ``task`` ending ``status``, if its submission asked for it. Its
    delivery id names the end (``Delivery.for_task_end``), so it needs the end's time: when the
    caller's copy is from before the end (the claim's, a cancel's read), the task is read again."""
    notify = task.submission.notify
    if queues is None or notify is None or status.value not in notify.events:
        return False
    if task.status is not status or task.finished_at is None:
        now = store.tasks.get(task.task_id)
        task = now if now.status is status else task  # moved on since (a redrive): this end's time is gone
    payload = {"task_id": task.task_id, "tenant": task.tenant, "user": task.user, "status": status.value,
               "root_id": task.root_id, "metadata": task.submission.metadata}  # fmt: skip
    end = Delivery.for_task_end(task.tenant, notify.url, payload, finished_at=task.finished_at)
    queues.send_webhook(end.to_json())
    return True


def enqueue_event(queues: TaskQueues | None, task: Task, kind: str, **detail: object) -> bool:
    """Queue a conversation's callback (``idle``, ``message_received``), if the submission asked."""
    notify = task.submission.notify
    if queues is None or notify is None or kind not in notify.events:
        return False
    payload = {"task_id": task.task_id, "tenant": task.tenant, "user": task.user, "status": task.status.value,
               "root_id": task.root_id, "metadata": task.submission.metadata, **detail}  # fmt: skip
    queues.send_webhook(Delivery.for_task_event(task.tenant, notify.url, kind, payload).to_json())
    return True


def deliver(store: Storage, body: str) -> int:
    """POST one queued delivery; returns the receiver's status. Raises ``DeliveryFailed``
    (retry later) or ``FetchRefused`` (never: to the DLQ)."""
    delivery = Delivery.from_json(body)
    secret = store.webhook_secrets.get_or_create(delivery.tenant)
    try:
        status = post(delivery, secret)
    except FetchRefused:
        raise
    except (OSError, TimeoutError) as exc:
        raise DeliveryFailed(str(exc)) from None
    if not 200 <= status < 300:
        raise DeliveryFailed(f"{delivery.url} answered {status}")
    log.info("callback %s delivered to %s (%d)", delivery.delivery_id, delivery.url, status)
    return status


# Around a delivery: its tenant's signing secret read first, the retry's visibility change or the
# DLQ send after. A deliverer starts one with at least longest_delivery_seconds() + this left.
DELIVERY_MARGIN_SECONDS = 5.0


def time_for_another(remaining_ms: int) -> bool:
    """Whether a deliverer with ``remaining_ms`` of its invocation left may start a delivery:
    one cut off by the invocation's end would take the whole batch back with it (the Lambda
    service returns every record of an invocation that timed out, delivered or not)."""
    return remaining_ms >= (longest_delivery_seconds() + DELIVERY_MARGIN_SECONDS) * 1000


def backoff_seconds(receive_count: int) -> int:
    """The wait before the next try: 5 s, 20 s, 80 s, ... at most 15 minutes (SQS's maximum)."""
    return int(min(900, 5 * 4 ** max(0, receive_count - 1)))


def handle_message(
    store: Storage, queues: TaskQueues, body: str, receipt: str, receive_count: int, *, delete: bool = True
) -> str:
    """What a deliverer does with one received message: ``delivered``, ``dead_lettered`` (a
    refused URL, or a body that is not a delivery) or ``retry`` (left on the queue, hidden for
    the backoff; SQS dead-letters it after the last attempt). ``delete=False``: the caller
    deletes what is done (a Lambda's event source, from the batch's reported failures)."""
    try:
        deliver(store, body)
    except DeliveryFailed as exc:
        log.warning("callback not delivered (attempt %d): %s", receive_count, exc)
        queues.sqs.change_message_visibility(
            QueueUrl=queues.webhooks_url(), ReceiptHandle=receipt, VisibilityTimeout=backoff_seconds(receive_count)
        )
        return "retry"
    except (FetchRefused, ValueError, KeyError) as exc:
        log.warning("callback dead-lettered: %s", exc)
        queues.sqs.send_message(
            QueueUrl=queues.webhooks_dlq_url(), MessageBody=body,
            MessageAttributes={"agentq-reason": {"DataType": "String", "StringValue": str(exc)[:1000]}},
        )  # fmt: skip
    else:
        if delete:
            queues.sqs.delete_message(QueueUrl=queues.webhooks_url(), ReceiptHandle=receipt)
        return "delivered"
    if delete:
        queues.sqs.delete_message(QueueUrl=queues.webhooks_url(), ReceiptHandle=receipt)
    return "dead_lettered"


def delivery_loop(store: Storage, queues: TaskQueues, stop: threading.Event) -> None:
    """The local deliverer: long-polls the webhooks queue until ``stop``. Each message of a
    batch is handled on its own: one that fails leaves the others delivered."""
    while not stop.is_set():
        try:
            got: Any = queues.sqs.receive_message(
                QueueUrl=queues.webhooks_url(), MaxNumberOfMessages=10, WaitTimeSeconds=1,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )  # fmt: skip
        except Exception:
            log.warning("webhook delivery loop failed; going on", exc_info=True)
            stop.wait(1)
            continue
        for message in got.get("Messages", []):
            count = int(message.get("Attributes", {}).get("ApproximateReceiveCount", 1))
            try:
                handle_message(store, queues, message["Body"], message["ReceiptHandle"], count)
            except Exception:  # an outage on this one: it comes back after its visibility; the rest go on
                log.warning("webhook delivery failed; the message comes back", exc_info=True)
