"""Dead-letter queues: see what is there and why, and send it back to be resumed.

A redriven message names its task; the dispatcher sees the agentq reason attribute on a
message for a task it failed and requeues that task, which resumes at its checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from agentq.core.errors import TaskNotFound
from agentq.queueing.queues import (
    DEAD_LETTER_REASON,
    TaskMessage,
    TaskQueues,
    describe_body,
)
from agentq.resources import TIERS
from agentq.storage.container import Storage

log = logging.getLogger("agentq.dlq")

PEEK_SECONDS = 5


@dataclass
class DeadLetter:
    tier: str
    message_id: str
    body: str
    reason: str
    task_id: str | None
    task_status: str | None
    sent_at: float


def _peek(queues: TaskQueues, tier: str, limit: int) -> list[dict[str, Any]]:
    """Read up to ``limit`` messages without consuming them (they are made visible again)."""
    url = queues.dlq_url(tier)
    seen: dict[str, dict[str, Any]] = {}
    while len(seen) < limit:
        resp = queues.sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=min(10, limit - len(seen)),
            VisibilityTimeout=PEEK_SECONDS,
            MessageAttributeNames=["All"],
            AttributeNames=["SentTimestamp"],
        )
        batch = resp.get("Messages", [])
        if not batch:
            break
        for m in batch:
            seen.setdefault(m["MessageId"], m)
    for m in seen.values():
        with contextlib.suppress(ClientError):
            queues.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
    return list(seen.values())


def list_dead_letters(
    queues: TaskQueues, store: Storage, tier: str | None = None, limit: int = 100
) -> list[DeadLetter]:
    out: list[DeadLetter] = []
    for t in [tier] if tier else list(TIERS):
        for m in _peek(queues, t, limit):
            reason = (
                m.get("MessageAttributes", {})
                .get(DEAD_LETTER_REASON, {})
                .get("StringValue", "moved by SQS after maxReceiveCount")
            )
            task_id: str | None = None
            status: str | None = None
            try:
                task_id = TaskMessage.model_validate_json(m["Body"]).task_id
                status = store.tasks.get(task_id).status.value
            except (ValueError, TaskNotFound):
                pass
            out.append(
                DeadLetter(
                    tier=t,
                    message_id=m["MessageId"],
                    body=describe_body(m["Body"]),
                    reason=reason,
                    task_id=task_id,
                    task_status=status,
                    sent_at=int(m.get("Attributes", {}).get("SentTimestamp", "0")) / 1000,
                )
            )
    return out


@dataclass
class RedriveReport:
    tier: str
    method: str  # "StartMessageMoveTask" or "receive/send/delete"
    moved: int | None  # None when SQS moves them asynchronously


def redrive(queues: TaskQueues, tier: str | None = None) -> list[RedriveReport]:
    """Move every message of the tier DLQs back to their source queues."""
    reports = []
    for t in [tier] if tier else list(TIERS):
        reports.append(_redrive_tier(queues, t))
    return reports


def _arn(queues: TaskQueues, url: str) -> str:
    attrs = queues.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return str(attrs["Attributes"]["QueueArn"])


def _redrive_tier(queues: TaskQueues, tier: str) -> RedriveReport:
    source, dlq = queues.url(tier), queues.dlq_url(tier)
    try:
        queues.sqs.start_message_move_task(SourceArn=_arn(queues, dlq), DestinationArn=_arn(queues, source))
        return RedriveReport(tier, "StartMessageMoveTask", None)
    except (ClientError, NotImplementedError) as exc:
        log.info("StartMessageMoveTask unavailable (%s); moving messages one batch at a time", exc)
    moved = 0
    while True:
        batch = queues.sqs.receive_message(
            QueueUrl=dlq, MaxNumberOfMessages=10, VisibilityTimeout=30, MessageAttributeNames=["All"]
        ).get("Messages", [])
        if not batch:
            return RedriveReport(tier, "receive/send/delete", moved)
        entries = [
            {
                "Id": str(i),
                "MessageBody": m["Body"],
                **({"MessageAttributes": m["MessageAttributes"]} if m.get("MessageAttributes") else {}),
            }
            for i, m in enumerate(batch)
        ]
        sent = queues.sqs.send_message_batch(QueueUrl=source, Entries=entries)
        ok = {e["Id"] for e in sent.get("Successful", [])}
        to_delete = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch) if str(i) in ok]
        if to_delete:
            queues.sqs.delete_message_batch(QueueUrl=dlq, Entries=to_delete)
        moved += len(to_delete)
