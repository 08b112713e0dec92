"""Dead-letter queues: see what is there and why, and send it back to be resumed.

A redriven message names its task; the dispatcher sees the agentq reason attribute on a
message for a task it failed and requeues that task, which resumes at its checkpoint. Out of
the failure it was dead-lettered for only (``agentq-dead-letter``, the id of that failure on
META): a copy SQS delivers again after the resumed task failed once more is deleted, and the
later dead letter, whose task still says failed, is the one to redrive.

A task whose message agentq dead-letters says ``failed`` before the message reaches the DLQ
(``queueing.dispatch._failures.retry_or_dead_letter`` writes the failure, then the worker or
the Lambda sends the message). A listing keeps that true for what it shows: SQS has no peek, so
it receives the messages, and it reads their tasks' statuses while it holds them (invisible,
``PEEK_SECONDS`` at a time, renewed by a long listing), until it returns. A redrive racing the
listing cannot take a message out from under it, requeue its task and leave the listing showing
a dead letter whose task already runs again. The one dead letter whose task may still say
running is SQS's own move after ``sqs_max_receive_count`` receives (reason "moved by SQS after
maxReceiveCount", in AWS and on moto alike): a message no worker got through the dispatcher, so
nothing could write the task's failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from agentq.core.models import Task
from agentq.queueing.queues import (
    DEAD_LETTER_REASON,
    TaskMessage,
    TaskQueues,
    describe_body,
)
from agentq.queueing.task_reads import read_tasks, task_or_none
from agentq.resources import TIERS
from agentq.storage.container import Storage

log = logging.getLogger("agentq.dlq")

PEEK_SECONDS = 5
HELD_WAIT_SECONDS = PEEK_SECONDS + 1  # how long a listing or a redrive waits for messages another one holds
HELD_POLL_SECONDS = 0.1
SQS_MOVED = "moved by SQS after maxReceiveCount"  # the reason of a message agentq did not dead-letter


@dataclass
class DeadLetter:
    tier: str
    message_id: str
    body: str
    reason: str
    task_id: str | None
    task_status: str | None
    sent_at: float
    tenant: str | None = None  # the task's tenant: the HTTP API lists a tenant's own dead letters only


def _held_elsewhere(queues: TaskQueues, url: str, ours: int, patience: float) -> bool:
    """Are messages of this DLQ held by another listing or a redrive (received, not by us)?
    Then wait a moment, until ``patience`` (a monotonic time) at most, and look again: a
    listing holds them for its reads only, so a console's poll must not make a redrive miss
    a message, nor another listing leave it out. A redrive holds another tenant's messages
    for its whole scan; past ``patience`` they are left out."""
    if time.monotonic() >= patience:
        return False
    attrs = queues.sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    released = int(attrs.get("ApproximateNumberOfMessages", "0")) > 0  # since our receive came back empty
    if not released and int(attrs.get("ApproximateNumberOfMessagesNotVisible", "0")) <= ours:
        return False
    time.sleep(HELD_POLL_SECONDS)  # the counts are approximate (in AWS): never a tight loop on them
    return True


def list_dead_letters(
    queues: TaskQueues, store: Storage, tier: str | None = None, limit: int = 100, tenant: str | None = None
) -> list[DeadLetter]:
    """The dead letters of ``tier`` (every tier by default) among the first ``limit`` messages of
    each, each with its task's status as read while the listing held the message (see the
    module's docstring). ``tenant``: that tenant's only (the HTTP API): a DLQ every tenant shares
    may hold any number of another tenant's ahead of them, so the caller passes a larger
    ``limit`` than a listing of everything needs."""
    out: list[DeadLetter] = []
    for t in [tier] if tier else list(TIERS):
        out += _listed(queues, store, t, limit, tenant)
    return out


RENEW_MARGIN_SECONDS = 2  # a listing renews its holds this long before the first would lapse


def _listed(queues: TaskQueues, store: Storage, tier: str, limit: int, tenant: str | None) -> list[DeadLetter]:
    """Receive up to ``limit`` messages, held (invisible) until the end, then made visible
    again: received, not consumed. Each batch's tasks are read as it comes in (one read for the
    batch), and a long scan renews its holds before they lapse: what it shows is held from the
    read of its task's status until it returns, however many messages it looks at."""
    url = queues.dlq_url(tier)
    held: dict[str, str] = {}  # message id -> receipt handle
    letters: dict[str, DeadLetter] = {}
    tasks: dict[str, Task | None] = {}
    received = 0
    patience = time.monotonic() + HELD_WAIT_SECONDS
    lapse = float("inf")  # when the oldest hold lapses
    try:
        while received < limit:
            if time.monotonic() >= lapse - RENEW_MARGIN_SECONDS:
                _renew(queues, url, held)
                lapse = time.monotonic() + PEEK_SECONDS
            asked = time.monotonic()
            batch = queues.sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=min(10, limit - received),
                VisibilityTimeout=PEEK_SECONDS,
                MessageAttributeNames=["All"],
                AttributeNames=["SentTimestamp"],
            ).get("Messages", [])
            if not batch:
                if _held_elsewhere(queues, url, len(held), patience):
                    continue
                break
            lapse = min(lapse, asked + PEEK_SECONDS)
            received += len(batch)
            held.update((m["MessageId"], m["ReceiptHandle"]) for m in batch)
            ids = {m["MessageId"]: _task_id(m["Body"]) for m in batch}
            tasks.update(read_tasks(store, [t for t in dict.fromkeys(ids.values()) if t and t not in tasks]))
            for m in batch:
                letter = _dead_letter(tier, m, ids[m["MessageId"]], tasks)
                if tenant is None or letter.tenant == tenant:
                    letters[m["MessageId"]] = letter
        return list(letters.values())
    finally:
        _release(queues, url, held.values(), "a listing")


def _renew(queues: TaskQueues, url: str, held: dict[str, str]) -> None:
    """Hold what a listing holds for another ``PEEK_SECONDS``, ten a call."""
    receipts = list(held.values())
    for start in range(0, len(receipts), 10):
        entries = [
            {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": PEEK_SECONDS}
            for i, r in enumerate(receipts[start : start + 10])
        ]
        failed = queues.sqs.change_message_visibility_batch(QueueUrl=url, Entries=entries).get("Failed", [])
        if failed:  # lapsed and received elsewhere meanwhile: the listing was held up past its hold
            log.warning("a listing lost its hold on %d dead letter(s) of %s", len(failed), url)


def _task_id(body: str) -> str | None:
    try:
        return TaskMessage.model_validate_json(body).task_id
    except ValueError:
        return None


def _dead_letter(tier: str, m: dict[str, Any], task_id: str | None, tasks: dict[str, Task | None]) -> DeadLetter:
    reason = m.get("MessageAttributes", {}).get(DEAD_LETTER_REASON, {}).get("StringValue", SQS_MOVED)
    task = tasks.get(task_id) if task_id else None
    return DeadLetter(
        tier=tier,
        message_id=m["MessageId"],
        body=describe_body(m["Body"]),
        reason=reason,
        task_id=task_id,
        task_status=task.status.value if task else None,
        sent_at=int(m.get("Attributes", {}).get("SentTimestamp", "0")) / 1000,
        tenant=task.tenant if task else None,
    )


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
    return RedriveReport(tier, "receive/send/delete", _move_back(queues, source, dlq))


REDRIVE_HOLD_SECONDS = 60  # how long a redrive holds a message it does not move (another's, or a later one)


def _depth(queues: TaskQueues, url: str) -> int:
    """The messages of a queue, visible or not (another listing or redrive may hold some)."""
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attrs = queues.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return sum(int(attrs.get(name, "0")) for name in names)


def _move_back(queues: TaskQueues, source: str, dlq: str) -> int:
    """Move what the DLQ held when this began, each message once; how many moved.

    A worker sends a poison message straight back to the DLQ; moving those copies again would
    go on for as long as workers run (it did: 3,890 dead-letterings in 120 s for 200 messages).
    So a message sent to the DLQ after this began (``SentTimestamp``, against this host's clock)
    is held, not moved, and made visible again at the end; and no more are moved than the DLQ's
    depth when this began, which ends it even where the clocks disagree. A message another
    listing or redrive holds is waited for, as ``redrive_for_tenant`` does (``_held_elsewhere``).
    A message is deleted only after its copy was sent: a failure in between leaves a duplicate,
    which the task's lease and status make harmless."""
    began_ms = int(time.time() * 1000)
    budget = _depth(queues, dlq)
    later: dict[str, str] = {}  # message id -> receipt handle
    moved = 0
    patience = time.monotonic() + HELD_WAIT_SECONDS
    try:
        while moved < budget:
            batch = queues.sqs.receive_message(
                QueueUrl=dlq,
                MaxNumberOfMessages=min(10, budget - moved),
                VisibilityTimeout=REDRIVE_HOLD_SECONDS,
                MessageAttributeNames=["All"],
                AttributeNames=["SentTimestamp"],
            ).get("Messages", [])
            if not batch:
                if _held_elsewhere(queues, dlq, len(later), patience):
                    continue
                break
            older = []
            for m in batch:
                if int(m.get("Attributes", {}).get("SentTimestamp", "0")) > began_ms:
                    later[m["MessageId"]] = m["ReceiptHandle"]
                else:
                    older.append(m)
            moved += _send_back(queues, source, dlq, older)
    finally:
        _release(queues, dlq, later.values(), "a redrive")
    return moved


def _send_back(queues: TaskQueues, source: str, dlq: str, messages: list[dict[str, Any]]) -> int:
    """Send ``messages`` to ``source`` with their attributes, then delete those sent from the
    DLQ; how many moved. One SQS refused stays held, and comes back once its hold lapses."""
    if not messages:
        return 0
    entries = [
        {
            "Id": str(i),
            "MessageBody": m["Body"],
            **({"MessageAttributes": m["MessageAttributes"]} if m.get("MessageAttributes") else {}),
        }
        for i, m in enumerate(messages)
    ]
    sent = queues.sqs.send_message_batch(QueueUrl=source, Entries=entries)
    for failed in sent.get("Failed", []):
        log.warning("SQS refused to send a dead letter back (%s): it stays in the DLQ", failed.get("Code"))
    ok = {e["Id"] for e in sent.get("Successful", [])}
    to_delete = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages) if str(i) in ok]
    if to_delete:
        queues.sqs.delete_message_batch(QueueUrl=dlq, Entries=to_delete)
    return len(to_delete)


def _release(queues: TaskQueues, url: str, receipts: Iterable[str], holder: str) -> None:
    """Make the messages a redrive held, and did not move, visible again."""
    for receipt in receipts:
        try:
            queues.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=receipt, VisibilityTimeout=0)
        except ClientError:
            log.warning("could not release a dead letter held during %s; it reappears on its own", holder)


MAX_TENANT_REDRIVE = 1000  # messages one tenant redrive looks at (a bound on one API request's work)


@dataclass
class TenantRedrive:
    tier: str
    moved: int
    task_ids: list[str]


def redrive_for_tenant(
    queues: TaskQueues,
    store: Storage,
    tenant: str,
    tier: str,
    max_messages: int = MAX_TENANT_REDRIVE,
    message_ids: Collection[str] | None = None,
) -> TenantRedrive:
    """Move one tenant's dead letters of a tier back to the tier's queue, and nobody else's.

    ``StartMessageMoveTask`` moves a whole queue, so this receives instead: a message that
    names one of ``tenant``'s tasks is sent back (with its attributes: the agentq reason is
    what tells the dispatcher to requeue a task it failed) and then deleted; any other message
    stays hidden until the scan ends, so it is seen once, and is then made visible again.
    A message is deleted only after its copy was sent, so a failure in between can at worst
    leave a duplicate, which the task's lease and status make harmless.

    ``message_ids``: only those messages (ids as a listing gave them), so a redrive moves what
    the person pressing it was shown, never a dead letter that came after their listing; the scan
    ends once it has seen every one. One no longer there (redriven meanwhile) is not moved, and
    neither is one of another tenant's, named or not. None: every one of the tenant's.
    """
    source, dlq = queues.url(tier), queues.dlq_url(tier)
    wanted = None if message_ids is None else set(message_ids)
    owners: dict[str, str | None] = {}
    held: list[str] = []
    moved: list[str] = []
    seen = 0
    patience = time.monotonic() + HELD_WAIT_SECONDS

    def owner(task_id: str) -> str | None:
        if task_id not in owners:
            task = task_or_none(store, task_id)
            owners[task_id] = task.tenant if task is not None else None
        return owners[task_id]

    try:
        while seen < max_messages and (wanted is None or wanted):
            batch = queues.sqs.receive_message(
                QueueUrl=dlq,
                MaxNumberOfMessages=min(10, max_messages - seen),
                VisibilityTimeout=REDRIVE_HOLD_SECONDS,
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if not batch:
                if _held_elsewhere(queues, dlq, len(held), patience):
                    continue
                break
            seen += len(batch)
            for m in batch:
                task_id = _task_id(m["Body"])
                named = wanted is None or m["MessageId"] in wanted
                if wanted is not None:
                    wanted.discard(m["MessageId"])
                if not named or task_id is None or owner(task_id) != tenant:
                    held.append(m["ReceiptHandle"])
                    continue
                attributes = m.get("MessageAttributes") or {}
                queues.sqs.send_message(
                    QueueUrl=source,
                    MessageBody=m["Body"],
                    **({"MessageAttributes": attributes} if attributes else {}),
                    **queues.group(tenant),
                )
                queues.sqs.delete_message(QueueUrl=dlq, ReceiptHandle=m["ReceiptHandle"])
                moved.append(task_id)
    finally:
        _release(queues, dlq, held, "a tenant redrive")
    log.info("tenant %s redrove %d dead letter(s) of tier %s", tenant, len(moved), tier)
    return TenantRedrive(tier=tier, moved=len(moved), task_ids=list(dict.fromkeys(moved)))
