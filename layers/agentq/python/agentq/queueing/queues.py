"""The tier queues: what a task message is, and how agentq sends, returns and dead-letters it.

A message only names a task; everything else is read from the table, so a duplicate,
stale or redriven message is harmless: the lease and the task status decide what happens.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from agentq.resources import TIERS, ResourceNames

MessageKind = Literal[
    "run",
    "continue",
    "wake",
    "redrive",
    "safety_net",
    "release_holds",
    "renewed",
    "swept",
    "recovered",
    "approval_due",
    "batch_poll",
    "schedule",
]
DEAD_LETTER_REASON = "agentq-reason"  # message attribute set when agentq dead-letters a message
# ... and, when agentq failed the task for it, which failure (META's ``dead_letter``): a redrive
# requeues the task only out of that failure, so a copy delivered again after the task failed
# once more (SQS delivers at least once) leaves that later failure, and its dead letter, alone.
DEAD_LETTER_ID = "agentq-dead-letter"

# SQS's answers to a receipt handle that is no longer ours: the message was deleted through a
# duplicate's receipt, or our visibility lapsed while we were stopped and another receive took
# it. Both are expected races under takeovers, not faults.
STALE_RECEIPT_CODES = frozenset(
    {"ReceiptHandleIsInvalid", "AWS.SimpleQueueService.MessageNotInflight", "MessageNotInflight"}
)


def is_stale_receipt(exc: BaseException) -> bool:
    """True when ``exc`` is SQS refusing a receipt handle that another receive superseded."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    error = response.get("Error", {})
    code = str(error.get("Code", ""))
    return code in STALE_RECEIPT_CODES or (
        code == "InvalidParameterValue" and "receipt handle" in str(error.get("Message", "")).lower()
    )


class TaskMessage(BaseModel):
    task_id: str = Field(min_length=1, max_length=128)
    kind: MessageKind = "run"
    sent_at: float = Field(default_factory=time.time)
    task_token: str | None = Field(default=None, max_length=4096)  # from a Step Functions fan-out
    spawn_id: str | None = Field(default=None, max_length=256)  # on a wake: the fan-out that ended
    schedule: str | None = Field(default=None, max_length=200)  # on a schedule's fire: <tenant>#<name>
    scheduled_time: str | None = Field(default=None, max_length=64)  # ... and its time (ISO 8601, from the Scheduler)


@dataclass
class TaskQueues:
    """Queue URLs by tier, resolved once, and the few operations agentq performs on them."""

    sqs: Any
    names: ResourceNames
    _urls: dict[str, str] = field(default_factory=dict)
    fair: bool = True  # send tier messages with the tenant as MessageGroupId (SQS fair queues)

    def url(self, tier: str) -> str:
        if tier not in self._urls:
            self._urls[tier] = self.sqs.get_queue_url(QueueName=self.names.queue(tier))["QueueUrl"]
        return self._urls[tier]

    def dlq_url(self, tier: str) -> str:
        key = f"{tier}-dlq"
        if key not in self._urls:
            self._urls[key] = self.sqs.get_queue_url(QueueName=self.names.dlq(tier))["QueueUrl"]
        return self._urls[key]

    def webhooks_url(self) -> str:
        if "webhooks" not in self._urls:
            self._urls["webhooks"] = self.sqs.get_queue_url(QueueName=self.names.webhooks)["QueueUrl"]
        return self._urls["webhooks"]

    def webhooks_dlq_url(self) -> str:
        if "webhooks-dlq" not in self._urls:
            self._urls["webhooks-dlq"] = self.sqs.get_queue_url(QueueName=self.names.webhooks_dlq)["QueueUrl"]
        return self._urls["webhooks-dlq"]

    def send_webhook(self, body: str) -> None:
        self.sqs.send_message(QueueUrl=self.webhooks_url(), MessageBody=body)

    def tier_of(self, queue: str) -> str:
        """The tier of a queue given its URL, ARN or name."""
        name = queue.rstrip("/").split("/")[-1].split(":")[-1]
        for tier in TIERS:
            if name == self.names.queue(tier):
                return tier
        raise ValueError(f"{queue!r} is not one of this deployment's tier queues")

    def send(
        self, task_id: str, tier: str, kind: MessageKind = "run", delay_seconds: int = 0, *, tenant: str | None
    ) -> str:
        """``tenant``: the message's fair-queue group (``MessageGroupId``): SQS fair queues
        serve a quiet tenant's messages ahead of a noisy one's backlog. Required (None only
        where no task is known): a message sent without it, a continuation or a wake, would
        leave the fair queue's grouping."""
        body = TaskMessage(task_id=task_id, kind=kind).model_dump_json()
        resp = self.sqs.send_message(
            QueueUrl=self.url(tier), MessageBody=body, DelaySeconds=delay_seconds, **self.group(tenant)
        )
        return str(resp["MessageId"])

    def group(self, tenant: str | None) -> dict[str, str]:
        """The ``send_message`` arguments that put a message in ``tenant``'s fair-queue group."""
        return {"MessageGroupId": tenant[:128]} if tenant and self.fair else {}

    def send_body(self, tier: str, body: str, delay_seconds: int = 0, *, tenant: str | None) -> str:
        """Send ``body`` again as a fresh message (receive count 1): how a message is renewed."""
        resp = self.sqs.send_message(
            QueueUrl=self.url(tier), MessageBody=body, DelaySeconds=delay_seconds, **self.group(tenant)
        )
        return str(resp["MessageId"])

    def dead_letter(
        self,
        tier: str,
        body: str,
        reason: str,
        attributes: dict[str, Any] | None = None,
        *,
        dead_letter_id: str | None = None,
    ) -> None:
        """Put a message in the tier's DLQ with the reason attached (the caller deletes the
        original), and the failure it was dead-lettered for when agentq failed its task
        (``dead_letter_id``; a redriven message's older one is never carried over)."""
        ours = (DEAD_LETTER_REASON, DEAD_LETTER_ID)
        attrs = {k: v for k, v in (attributes or {}).items() if k not in ours}
        attrs[DEAD_LETTER_REASON] = {"DataType": "String", "StringValue": reason[:1000]}
        if dead_letter_id is not None:
            attrs[DEAD_LETTER_ID] = {"DataType": "String", "StringValue": dead_letter_id}
        self.sqs.send_message(QueueUrl=self.dlq_url(tier), MessageBody=body, MessageAttributes=attrs)

    def change_visibility(self, tier: str, receipt: str, seconds: int) -> None:
        self.sqs.change_message_visibility(QueueUrl=self.url(tier), ReceiptHandle=receipt, VisibilityTimeout=seconds)

    def delete(self, tier: str, receipt: str) -> None:
        self.sqs.delete_message(QueueUrl=self.url(tier), ReceiptHandle=receipt)


def describe_body(body: str) -> str:
    """A short, safe rendering of a message body for logs and DLQ listings."""
    try:
        return json.dumps(json.loads(body))[:200]
    except ValueError:
        return repr(body[:200])
