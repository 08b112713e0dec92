"""The tier queues: what a task message is, and how agentq sends, returns and dead-letters it.

A message only names a task; everything else is read from the table, so a duplicate,
stale or redriven message is harmless: the lease and the task status decide what happens.

**Pools.** A deployment may run a second set of tier queues, a *pool*, for the tasks only some
hosts can run: ``{prefix}-workspace-{tier}`` for the tasks with a workspace, which need
bubblewrap and so a host with user namespaces (the EC2 tier, docs/SANDBOX.md). ``pool`` is the
set this process reads, and where what it sends of its own goes (a continuation stays where it
was received); ``workspace_pool`` is where a task with a workspace must run. A submission is sent
there directly (``pool_for``); any other message of such a task that reaches a runner of another
pool is forwarded there by the dispatcher before anything runs (``forwards``). Without a
workspace pool (the local stack) nothing changes: one set of queues, every task on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, Field

from agentq.core.models import TaskSubmission
from agentq.core.workspace import has_workspace
from agentq.resources import TIERS, ResourceNames

log = logging.getLogger("agentq.queues")

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
    "remote_poll",
    "schedule",
]
DEAD_LETTER_REASON = "agentq-reason"  # message attribute set when agentq dead-letters a message
# ... and, when agentq failed the task for it, which failure (META's ``dead_letter``): a redrive
# requeues the task only out of that failure, so a copy delivered again after the task failed
# once more (SQS delivers at least once) leaves that later failure, and its dead letter, alone.
DEAD_LETTER_ID = "agentq-dead-letter"
# SQS's refusals of a message as it is (too large, counting its attributes; characters it does
# not take; an attribute it does not take): the same message sent again is refused again.
REFUSED_MESSAGE_CODES = frozenset(
    {"InvalidParameterValue", "InvalidMessageContents", "InvalidAttributeValue", "InvalidAttributeName"}
)

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


POOL_VARIABLE = "AGENTQ_QUEUE_POOL"  # the pool of tier queues this process reads (unset: the default one)
WORKSPACE_POOL_VARIABLE = "AGENTQ_WORKSPACE_POOL"  # the pool where tasks with a workspace run (unset: none)
WORKSPACE_POOL = "workspace"  # the name the CDK stack gives it: {prefix}-workspace-{tier}
_OWN = "<own>"


def pooled(tier: str, pool: str | None) -> str:
    """The queue-name part of ``tier`` in ``pool`` (``ResourceNames.queue`` adds the prefix)."""
    return f"{pool}-{tier}" if pool else tier


# SQS's codes for a queue that is not there (the JSON protocol's, the query protocol's), and the
# note _lookup adds to that error naming the queue, which AWS's message does not: `agentq`'s CLI
# says it (cli.main.aws_failure), a worker's traceback shows it.
MISSING_QUEUE_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
MISSING_QUEUE_NOTE = "the queue not there: "


@dataclass
class TaskQueues:
    """Queue URLs by tier, resolved once, and the few operations agentq performs on them."""

    sqs: Any
    names: ResourceNames
    _urls: dict[str, str] = field(default_factory=dict)
    fair: bool = True  # send tier messages with the tenant as MessageGroupId (SQS fair queues)
    pool: str | None = None  # the tier queues this process reads and continues in (None: the default set)
    workspace_pool: str | None = None  # where tasks with a workspace must run (None: wherever they are sent)

    def url(self, tier: str, pool: str | None = _OWN) -> str:
        """The URL of ``tier``'s queue in ``pool`` (by default this process's own)."""
        name = pooled(tier, self.pool if pool == _OWN else pool)
        if name not in self._urls:
            self._urls[name] = self._lookup(self.names.queue(name))
        return self._urls[name]

    def dlq_url(self, tier: str) -> str:
        name = pooled(tier, self.pool)
        key = f"{name}-dlq"
        if key not in self._urls:
            self._urls[key] = self._lookup(self.names.dlq(name))
        return self._urls[key]

    def _lookup(self, queue: str) -> str:
        """``queue``'s URL; a queue that is not there keeps AWS's error, noted with its name."""
        try:
            return str(self.sqs.get_queue_url(QueueName=queue)["QueueUrl"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in MISSING_QUEUE_CODES:
                exc.add_note(MISSING_QUEUE_NOTE + queue)
            raise

    def pool_for(self, submission: TaskSubmission) -> str | None:
        """The pool a task of ``submission`` runs in: the workspace pool when it has a workspace
        (its ``workspace``, or a workspace tool among its tools) and the deployment has that
        pool, else the default one (never this process's own: the API reads none)."""
        needs = self.workspace_pool is not None and has_workspace(submission.workspace, submission.constraints.tools)
        return self.workspace_pool if needs else None

    def forwards(self, submission: TaskSubmission) -> bool:
        """Whether a task of ``submission`` must leave this process's pool for the workspace
        pool before anything of it runs here."""
        target = self.pool_for(submission)
        return target is not None and target != self.pool

    def webhooks_url(self) -> str:
        if "webhooks" not in self._urls:
            self._urls["webhooks"] = self._lookup(self.names.webhooks)
        return self._urls["webhooks"]

    def webhooks_dlq_url(self) -> str:
        if "webhooks-dlq" not in self._urls:
            self._urls["webhooks-dlq"] = self._lookup(self.names.webhooks_dlq)
        return self._urls["webhooks-dlq"]

    def send_webhook(self, body: str) -> None:
        self.sqs.send_message(QueueUrl=self.webhooks_url(), MessageBody=body)

    def tier_of(self, queue: str) -> str:
        """The tier of a queue of this process's pool given its URL, ARN or name."""
        name = queue.rstrip("/").split("/")[-1].split(":")[-1]
        for tier in TIERS:
            if name == self.names.queue(pooled(tier, self.pool)):
                return tier
        raise ValueError(f"{queue!r} is not one of this deployment's tier queues")

    def send(
        self,
        task_id: str,
        tier: str,
        kind: MessageKind = "run",
        delay_seconds: int = 0,
        *,
        tenant: str | None,
        pool: str | None = _OWN,
    ) -> str:
        """``tenant``: the message's fair-queue group (``MessageGroupId``): SQS fair queues
        serve a quiet tenant's messages ahead of a noisy one's backlog. Required (None only
        where no task is known): a message sent without it, a continuation or a wake, would
        leave the fair queue's grouping. ``pool``: the set of tier queues (``pool_for``; by
        default this process's own)."""
        body = TaskMessage(task_id=task_id, kind=kind).model_dump_json()
        resp = self.sqs.send_message(
            QueueUrl=self.url(tier, pool), MessageBody=body, DelaySeconds=delay_seconds, **self.group(tenant)
        )
        return str(resp["MessageId"])

    def group(self, tenant: str | None) -> dict[str, str]:
        """The ``send_message`` arguments that put a message in ``tenant``'s fair-queue group."""
        return {"MessageGroupId": tenant[:128]} if tenant and self.fair else {}

    def send_body(
        self, tier: str, body: str, delay_seconds: int = 0, *, tenant: str | None, pool: str | None = _OWN
    ) -> str:
        """Send ``body`` again as a fresh message (receive count 1): how a message is renewed,
        and forwarded to another pool."""
        resp = self.sqs.send_message(
            QueueUrl=self.url(tier, pool), MessageBody=body, DelaySeconds=delay_seconds, **self.group(tenant)
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
        try:
            self.sqs.send_message(QueueUrl=self.dlq_url(tier), MessageBody=body, MessageAttributes=attrs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in REFUSED_MESSAGE_CODES:
                raise  # an outage or throttling: the caller leaves the message, and it comes back
            # Refused as it is (in AWS, a body near 256 KB that our reason pushes over the limit,
            # which counts attributes): sending it again would be refused again, and the message
            # would come back every visibility timeout until SQS's own move took it, without a
            # reason. A short description of it goes instead, with the reason and only our attributes.
            log.warning("the %s DLQ refused a message (%s); dead-lettering a description of it", tier, exc)
            attrs = {k: v for k, v in attrs.items() if k in ours}
            attrs[DEAD_LETTER_REASON]["StringValue"] = f"{reason[:800]} (its body was refused by the DLQ: replaced)"
            self.sqs.send_message(QueueUrl=self.dlq_url(tier), MessageBody=stand_in(body, exc), MessageAttributes=attrs)

    def change_visibility(self, tier: str, receipt: str, seconds: int) -> None:
        self.sqs.change_message_visibility(QueueUrl=self.url(tier), ReceiptHandle=receipt, VisibilityTimeout=seconds)

    def delete(self, tier: str, receipt: str) -> None:
        self.sqs.delete_message(QueueUrl=self.url(tier), ReceiptHandle=receipt)


def stand_in(body: str, exc: ClientError) -> str:
    """What goes to the DLQ instead of a body it refused: its size, its digest, its first
    characters and why it was refused (a JSON object that is no task message: a redrive of it
    comes back as poison)."""
    error = exc.response.get("Error", {})
    refused = {
        "bytes": len(body.encode("utf-8", "surrogatepass")),
        "sha256": hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest(),
        "head": body[:200],
        "refused": f"{error.get('Code', '')}: {error.get('Message', '')}"[:300],
    }
    return json.dumps({"refused_body": refused})


def describe_body(body: str) -> str:
    """A short, safe rendering of a message body for logs and DLQ listings."""
    try:
        return json.dumps(json.loads(body))[:200]
    except ValueError:
        return repr(body[:200])
