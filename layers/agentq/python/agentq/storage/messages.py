"""A person's messages to a task: accepted in order, delivered into the conversation once.

Two counters on META carry the whole protocol. ``messages_received`` is how many messages the
task has accepted: a message is accepted by one transaction that bumps it from the value the
sender read (``n``) and puts ``MSG#<n+1>``, so messages are numbered without gaps in the order
they were accepted, and two senders racing for the same number cannot both win (the loser reads
again and takes the next). ``messages_delivered`` is how many of them the conversation holds: it
moves only in the step commit that puts them into the conversation (a ``MessageStep``, fenced
like every commit). So a worker killed before that commit delivered nothing (the next claim sees
``received > delivered`` and delivers them), and one killed after it delivered them once: the
step is the delivery. No message is marked, read back or deleted to deliver it.

Where the message goes depends on the task's status when it is accepted, in the same write:

- ``running``, ``queued``, ``waiting``, ``paused``, ``blocked``: it waits; the engine delivers
  it at the next turn boundary (a queued, waiting or paused task when it runs again). The step
  commit's META write returns the counters (``ReturnValues``), so learning that a message waits
  costs no read: none when nothing waits.
- ``succeeded`` or ``idle`` (answered, or interrupted): a follow-up. The same write moves the
  task back to ``queued`` (the caller then sends its queue message), and the run that claims it
  delivers the message and goes on from the conversation as it was. The first such write out
  of an end keeps that end (``task_items.first_end_writes``: what an MCP task handle answers).
- ``failed``, ``cancelled``, ``timed_out``, ``failed_outcome``, ``cost_exceeded``: refused, with the reason.
  A ``cost_exceeded`` task takes a message that raises its budget (``BudgetRaise``): a follow-up.

A raise that comes with a message is written by the same transaction that accepts it (the budget
on META, the submission's raised caps, ``budget.raised`` logged before ``message.received``),
after the same checks: a refused message raises nothing, and a retry with its idempotency key
finds the key (whose request hash counts the raise) and raises nothing again. The caps are
raised on the submission as each attempt reads it, and put only while it is still the one read
(``task_items.same_submission``): two messages raising the steps at once raise them by both,
and a move to another version made meanwhile is kept.

A turn never ends over a waiting message: the commit that would end the task, and the move to
``idle`` after an interrupt, are conditional on ``messages_received`` being what the engine has
delivered, so a message accepted while the last call was in flight is delivered, not stranded in
a finished task. An interrupt is ``interrupt_at`` on META: the next LLM step's commit is
conditional on its absence, so the answer of a call in flight is discarded (and charged: it is
settled as an orphan call), and the engine moves the task to ``idle`` (or delivers what waits).

Each of these writes logs its event in the same transaction (``storage.event_writes``):
``message.received`` with the accept, ``task.interrupt_requested``, ``task.status`` idle,
``conversation.closed``; the delivery is a step, an event of its own.
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.core.errors import IdempotencyConflict, IllegalTransition, MessageRefused, TaskNotFound
from agentq.core.models import DoubleTexting, Lease, TaskStatus, UserMessage
from agentq.core.records import ConversationMark, Inbox
from agentq.resources import TTL_ATTRIBUTE
from agentq.storage import keys
from agentq.storage.budget_items import SETTLED, BudgetRaise
from agentq.storage.event_writes import EVENT_TEXT_CHARS, NewEvent, logged_transact
from agentq.storage.leases import why_fenced
from agentq.storage.table import (
    Item,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    TransactionConflict,
    Update,
    absent,
    fence,
    fence_holds,
    plain,
    present,
)
from agentq.storage.task_items import (
    TaskItems,
    first_end_writes,
    live_keys,
    merged,
    read_submission,
    reopening,
    same_submission,
)

MESSAGE = "MSG#"
MESSAGE_KEY = "MSGKEY#"
MAX_MESSAGES_PER_TASK = 1000
ACCEPT_ATTEMPTS = 200  # senders racing for the next number: each loss means another one won
ACCEPT_BACKOFF_SECONDS = 0.02  # jitter between attempts, so racing senders spread out

BUSY = frozenset({TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.WAITING, TaskStatus.PAUSED})
REOPENED = frozenset({TaskStatus.SUCCEEDED, TaskStatus.IDLE})


REFUSALS = {
    TaskStatus.FAILED: "it failed; fork it to go on (POST /tasks/{id}/fork)",
    TaskStatus.CANCELLED: "it was cancelled; fork it to go on (POST /tasks/{id}/fork)",
    TaskStatus.TIMED_OUT: "it timed out; fork it to go on (POST /tasks/{id}/fork)",
    TaskStatus.FAILED_OUTCOME: "its answer did not reach its outcome's bar; fork it to go on (POST /tasks/{id}/fork)",
    TaskStatus.COST_EXCEEDED: "it ran out of budget; send the message with add_tokens (add_steps, add_usd) to raise "
    "it in the same request (agentq send --add-tokens N), or raise it first (POST /tasks/{id}/budget)",
}


def refusal(task_id: str, status: TaskStatus, error: Any = None) -> str:
    """Why a task in ``status`` takes no message, and what would go on from it. A failed task's
    advice follows how it failed: only one whose message went to the dead-letter queue
    (``error.dead_lettered``: out of retries, or unreadable) can be redriven; any other (a
    missing API key, a request the model refused) never reached one, and a redrive finds
    nothing, so it is told to fix the cause and fork."""
    if status is TaskStatus.FAILED and isinstance(error, dict):
        code = error.get("code")
        if error.get("dead_lettered"):
            return (
                f"it failed ({code}) and its message went to the dead-letter queue; fix the cause, then redrive "
                "it (POST /dead-letters/{tier}/redrive, agentq dlq redrive) to resume it, or fork it to go on"
            )
        if code:
            return (
                f"it failed ({code}); it never reached the dead-letter queue, so fix the cause and fork it to go on "
                f"(POST /tasks/{task_id}/fork)"
            )
    return REFUSALS[status].replace("{id}", task_id)


def message_sk(seq: int) -> str:
    return f"{MESSAGE}{seq:06d}"


def _key_sk(idempotency_key: str) -> str:
    return MESSAGE_KEY + hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]


def _request_hash(text: str, raised: BudgetRaise | None) -> str:
    """What an idempotency key is bound to: the text, and the raise that came with it (the same
    key with another raise is a conflict, not a replay). A message without a raise hashes as
    its text alone, as keys stored before raises were counted did."""
    if raised is None:
        return hashlib.sha256(text.encode()).hexdigest()
    amounts = f"\x00raise:{raised.tokens}:{raised.steps}:{raised.micros}"
    return hashlib.sha256((text + amounts).encode()).hexdigest()


@dataclass(frozen=True)
class Accepted:
    """A message the task took: ``reopened`` when it moved an answered or interrupted task back
    to ``queued`` (its queue message is the caller's to send); ``replayed`` when the same
    idempotency key had already delivered it (nothing was written this time); then ``delivered``
    says whether the conversation holds it yet (if not, and the task is queued, the request that
    took it may have died before sending the run's queue message: the caller sends it again)."""

    message: UserMessage
    status: TaskStatus  # the task's status after the write
    reopened: bool = False
    interrupting: bool = False
    replayed: bool = False
    delivered: bool = False


def inbox_of(meta: dict[str, Any] | None) -> Inbox:
    meta = meta or {}
    at = meta.get("interrupt_at")
    return Inbox(
        received=int(meta.get("messages_received") or 0),
        delivered=int(meta.get("messages_delivered") or 0),
        interrupt_at=float(at) if at is not None else None,
    )


def nothing_waits(delivered: int) -> ConditionBase:
    """The condition of a write that ends a turn: no message accepted beyond ``delivered``."""
    return (
        Attr("messages_received").not_exists() | Attr("messages_received").eq(delivered)
        if delivered == 0
        else Attr("messages_received").eq(delivered)
    )


class Messages:
    def __init__(self, table: Table, *, retention_seconds: int) -> None:
        self.table = table
        self.retention_seconds = retention_seconds

    def _meta(self, task_id: str, tenant: str | None) -> Item:
        """The task's META, if it exists and is ``tenant``'s: another tenant's task is not found."""
        meta = self.table.get(keys.meta_key(task_id))
        if meta is None or (tenant is not None and meta.get("tenant") != tenant):
            raise TaskNotFound(f"task {task_id} not found", field="task_id")
        return meta

    def accept(
        self,
        task_id: str,
        text: str,
        *,
        tenant: str | None = None,
        idempotency_key: str | None = None,
        double_texting: DoubleTexting = "queue",
        raised: BudgetRaise | None = None,
        reopen_ended: bool = True,
    ) -> Accepted:
        """Accept ``text`` as the task's next message (see the module), with ``raised``, the
        budget raise it carries, in the same write. ``reopen_ended`` False: a task that has ended
        (an answered one too) is refused, ``IllegalTransition`` with its ``status``, read in the
        attempt whose write is conditioned on it, so a task that ends meanwhile is never reopened
        (A2A: a task never restarts)."""
        request_hash = _request_hash(text, raised)
        for _ in range(ACCEPT_ATTEMPTS):
            meta = self._meta(task_id, tenant)
            if idempotency_key is not None:
                replay = self._replay(task_id, idempotency_key, request_hash)
                if replay is not None:
                    return replay
            status = TaskStatus(str(meta["status"]))
            if status.terminal and not reopen_ended:
                raise IllegalTransition(f"task {task_id} has ended ({status.value}) and takes no message here",
                                        field="task_id", status=status.value)  # fmt: skip
            self._check(task_id, meta, status, double_texting, raised)
            reopens = status in REOPENED or (raised is not None and status is TaskStatus.COST_EXCEEDED)
            received = int(meta.get("messages_received") or 0)
            now = time.time()
            message = UserMessage(message_id=uuid.uuid4().hex, seq=received + 1, text=text, sent_at=now)
            interrupting = double_texting == "interrupt" and status is TaskStatus.RUNNING
            write = self._meta_write(task_id, status, received, now, interrupting, reopens, raised)
            kept, first_end = first_end_writes(task_id, meta) if reopens else (Update(), [])
            actions: list[Patch | Put] = [
                Patch(write.name, write.key, merged(write.update, kept), write.condition),
                *first_end,
                Put(
                    "message",
                    {
                        **keys.item_key(task_id, message_sk(message.seq)),
                        **message.model_dump(),
                        "sent_at": Decimal(repr(now)),
                    },
                    absent(),
                ),
            ]
            if idempotency_key is not None:
                actions.append(
                    Put(
                        "key",
                        {
                            **keys.item_key(task_id, _key_sk(idempotency_key)),
                            "seq": message.seq,
                            "request_hash": request_hash,
                        },
                        absent(),
                    )
                )
            if raised is not None and raised.changes_submission:
                # Raised as read now, and put only while it is still that: another message's raise,
                # a move to another version, made meanwhile is kept (this attempt is tried again).
                current, read = read_submission(self.table, task_id)
                item = TaskItems.submission_item(task_id, raised.raised(current))
                actions.append(Put("submission", item, same_submission(read)))
            said = {"message_id": message.message_id, "seq": message.seq, "text": text[:EVENT_TEXT_CHARS]}
            if reopens:
                said["status"] = TaskStatus.QUEUED.value  # a follow-up: the event leaves the task queued
            if interrupting:
                said["interrupting"] = True
            events = [NewEvent("message.received", said)]
            if raised is not None:
                events.insert(0, NewEvent("budget.raised", raised.event_data()))
            try:
                logged_transact(self.table, task_id, actions, events, retry_moved=False)
            except (TransactionCancelled, TransactionConflict):
                # Another message took the number, the status moved, the key was used, the
                # submission it raises was replaced, or a write to META raced this one: look again.
                # (This attempt applied with its answer lost is no refusal: ``logged_transact``
                # finds its own event, and the message is accepted once.)
                time.sleep(random.uniform(0, ACCEPT_BACKOFF_SECONDS))
                continue
            return Accepted(
                message=message,
                status=TaskStatus.QUEUED if reopens else status,
                reopened=reopens,
                interrupting=interrupting,
            )
        raise MessageRefused(f"task {task_id} is taking too many messages at once; send again", field="task_id")

    def _check(
        self, task_id: str, meta: Item, status: TaskStatus, double_texting: DoubleTexting, raised: BudgetRaise | None
    ) -> None:
        """Every reason to refuse the message, before anything is written (its raise too). A
        ``cost_exceeded`` task takes the message that raises its budget: a follow-up, not a
        message to a busy task, whatever its ``double_texting``."""
        resumes = raised is not None and status is TaskStatus.COST_EXCEEDED
        if status in REFUSALS and not resumes:
            raise IllegalTransition(
                f"task {task_id} takes no messages: {refusal(task_id, status, meta.get('error'))}",
                field="task_id",
                status=status.value,
            )
        if meta.get("parent_id"):
            raise MessageRefused(
                f"task {task_id} is a sub-agent: it takes its instructions from its parent", field="task_id"
            )
        if meta.get("conversation_closed"):
            raise MessageRefused(f"task {task_id}'s conversation is closed", field="task_id")
        if int(meta.get("messages_received") or 0) >= MAX_MESSAGES_PER_TASK:
            raise MessageRefused(
                f"task {task_id} has taken the most messages a task may ({MAX_MESSAGES_PER_TASK:,}); fork it to go on",
                field="text",
            )
        if (status in REOPENED or resumes) and (meta.get(TTL_ATTRIBUTE) or float("inf")) <= time.time():
            raise IllegalTransition(
                f"task {task_id} is {status.value} and its retention ran out; it is being deleted", field="task_id"
            )
        if raised is not None and (raised.tokens or raised.micros) and ("cap" not in meta or SETTLED in meta):
            raise IllegalTransition(f"task {task_id} has no budget of its own to raise", field="add_tokens")
        if double_texting == "reject" and status in BUSY:
            raise MessageRefused(
                f"task {task_id} is {status.value} and refuses messages until it answers (double_texting: reject)",
                field="task_id",
            )

    def _meta_write(
        self,
        task_id: str,
        status: TaskStatus,
        received: int,
        now: float,
        interrupting: bool,
        reopens: bool,
        raised: BudgetRaise | None,
    ) -> Patch:
        counted = Attr("messages_received").eq(received) if received else Attr("messages_received").not_exists()
        condition = Attr("status").eq(status.value) & counted
        sets: dict[str, Any] = {"messages_received": received + 1, "updated_at": now}
        removes: list[str] = []
        update = Update()
        if interrupting:
            sets["interrupt_at"] = Decimal(repr(now))
        if reopens:
            # The follow-up's requeue: as ``Tasks.transition`` requeues (a clean lease, back in
            # the sweeper's index, no expiry), in the write that accepts the message.
            sets.update({"status": TaskStatus.QUEUED.value, "lease_expires": 0, **live_keys(task_id)})
            removes += ["error", "finished_at", TTL_ATTRIBUTE, "interrupt_at"]
            condition = condition & (Attr(TTL_ATTRIBUTE).not_exists() | Attr(TTL_ATTRIBUTE).gt(Decimal(repr(now))))
            update = reopening(now)
        if raised is not None and (raised.tokens or raised.micros):
            update = merged(update, raised.update())
            condition = condition & raised.condition()
        return Patch("meta", keys.meta_key(task_id), merged(Update(set=sets, remove=removes), update), condition)

    def _replay(self, task_id: str, idempotency_key: str, request_hash: str) -> Accepted | None:
        seen = self.table.get(keys.item_key(task_id, _key_sk(idempotency_key)))
        if seen is None:
            return None
        if seen.get("request_hash") != request_hash:
            raise IdempotencyConflict(
                "this Idempotency-Key was used for a different message to this task", field="Idempotency-Key"
            )
        stored = self.table.get(keys.item_key(task_id, message_sk(int(seen["seq"]))))
        meta = self.table.get(keys.meta_key(task_id)) or {}
        assert stored is not None  # written in the same transaction as the key
        return Accepted(
            message=_message(stored),
            status=TaskStatus(str(meta.get("status", "queued"))),
            replayed=True,
            delivered=inbox_of(meta).delivered >= int(seen["seq"]),
        )

    def waiting(self, task_id: str, *, after: int, upto: int) -> list[UserMessage]:
        """Messages ``after+1 .. upto`` in order (what a delivery puts into the conversation)."""
        if upto <= after:
            return []
        items = self.table.query(keys.task_pk(task_id), between=(message_sk(after + 1), message_sk(upto)))
        return [_message(i) for i in items]

    def listed(self, task_id: str, *, after: int = 0, upto: int | None = None) -> list[UserMessage]:
        """Every message the task has accepted, in order; with ``upto``, messages ``after+1 .. upto``
        (a page: messages are numbered without gaps, so a range of numbers is a range of items)."""
        if upto is not None:
            return self.waiting(task_id, after=after, upto=upto)
        return [_message(i) for i in self.table.query(keys.task_pk(task_id), prefix=MESSAGE)]

    def marks(self, task_id: str) -> list[ConversationMark]:
        """The follow-ups, interrupts and stops of the task's conversation, in order, from its
        event log (``EVENT#`` items: what those writes logged; see the module). One Query of
        the task's events, which are few besides one per message accepted."""
        out: list[ConversationMark] = []
        for raw in self.table.query(keys.task_pk(task_id), prefix=keys.EVENT):
            e = plain(raw)
            data, at, after = dict(e.get("data") or {}), float(e["at"]), int(e["after_step"])
            if e["type"] == "message.received":
                seq = int(data["seq"])
                if data.get("interrupting"):
                    out.append(ConversationMark("interrupt_requested", at, after, message=seq))
                if data.get("status") == TaskStatus.QUEUED.value:
                    out.append(ConversationMark("follow_up", at, after, message=seq))
            elif e["type"] == "task.interrupt_requested":
                out.append(ConversationMark("interrupt_requested", at, after))
            elif e["type"] == "task.status" and data.get("status") == TaskStatus.IDLE.value:
                out.append(ConversationMark("interrupted", at, after))
        return out

    def inbox(self, task_id: str) -> Inbox:
        return inbox_of(self.table.get(keys.meta_key(task_id)))

    def interrupt(self, task_id: str, *, tenant: str | None = None) -> TaskStatus:
        """Ask the task to stop at its earliest safe point (see the module). A task already
        ``idle`` is left as it is; one that is not running or queued cannot be interrupted."""
        meta = self._meta(task_id, tenant)
        status = TaskStatus(str(meta["status"]))
        if meta.get("parent_id"):
            raise MessageRefused(
                f"task {task_id} is a sub-agent: interrupt its parent, which takes its children's results",
                field="task_id",
            )
        if status is TaskStatus.IDLE:
            return status
        if status not in (TaskStatus.RUNNING, TaskStatus.QUEUED):
            raise IllegalTransition(
                f"task {task_id} is {status.value}: only a running or queued task can be interrupted",
                field="task_id",
                status=status.value,
            )
        now = Decimal(repr(time.time()))
        ask = Patch(
            "meta",
            keys.meta_key(task_id),
            Update(set={"interrupt_at": now, "updated_at": now}),
            Attr("status").is_in([TaskStatus.RUNNING.value, TaskStatus.QUEUED.value]),
        )
        try:
            logged_transact(self.table, task_id, [ask], NewEvent("task.interrupt_requested", {}))
        except TransactionCancelled as exc:
            moved = TaskStatus(str((self.table.get(keys.meta_key(task_id)) or {}).get("status", status.value)))
            if moved is TaskStatus.IDLE:
                return moved
            raise IllegalTransition(
                f"task {task_id} is {moved.value}: only a running or queued task can be interrupted",
                field="task_id",
                status=moved.value,
            ) from exc
        return status

    def go_idle(self, lease: Lease, *, delivered: int) -> Inbox | None:
        """An interrupted task stops: ``running -> idle``, fenced, and only while no message
        waits (then: the inbox as it is, and the engine delivers instead of stopping)."""
        now = time.time()
        idle = Patch(
            "meta",
            keys.meta_key(lease.task_id),
            Update(
                set={
                    "status": TaskStatus.IDLE.value,
                    "lease_expires": 0,
                    "updated_at": now,
                    TTL_ATTRIBUTE: int(now + self.retention_seconds),
                },
                remove=["interrupt_at", "inflight", "live_text"],
            ),
            fence(lease) & nothing_waits(delivered),
        )
        try:
            logged_transact(self.table, lease.task_id, [idle], NewEvent("task.status", {"status": "idle"}))
        except TransactionCancelled as exc:
            old = self.table.get(keys.meta_key(lease.task_id))
            if fence_holds(old, lease):
                return inbox_of(old)  # the fence holds: a message came in
            raise why_fenced(self.table, lease) from exc
        return None

    def close(self, task_id: str, *, tenant: str | None = None) -> None:
        """Close the conversation: it takes no more messages (the task runs on if it runs)."""
        self._meta(task_id, tenant)
        closing = Patch("meta", keys.meta_key(task_id), Update(set={"conversation_closed": True}), present())
        try:
            logged_transact(self.table, task_id, [closing], NewEvent("conversation.closed", {}))
        except TransactionCancelled as exc:  # deleted meanwhile (its retention ran out)
            raise TaskNotFound(f"task {task_id} not found", field="task_id") from exc


def _message(raw: Item) -> UserMessage:
    item = plain(raw)
    return UserMessage(
        message_id=str(item["message_id"]), seq=int(item["seq"]), text=str(item["text"]), sent_at=float(item["sent_at"])
    )
