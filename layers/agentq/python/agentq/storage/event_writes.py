"""Writing a task's event log: every change of META other than a step commit or a claim logs its
event in the write that makes it (the log itself, its positions and reads: ``storage/events.py``).

``EVENT#<seq>`` is written in the same ``TransactWriteItems`` as the META change, which bumps
META's ``seq`` under the condition ``seq = :s AND step = :k`` (besides its own). The event records
``after_step = k``. A write refused only because ``seq`` or ``step`` moved re-reads META and tries
again (``logged_transact``): that is the one place events are written. Each attempt is one
request, applied once: its ``ClientRequestToken`` makes botocore's retry of it (after an answer
lost once DynamoDB applied it) a replay, and its first event carries the same id (``write``), so
a retry refused where the token is not honoured finds its own event and counts as done, never as
a move to write again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.storage import keys
from agentq.storage.table import (
    Action,
    Check,
    Item,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    TransactionConflict,
    Update,
    absent,
    merge,
    plain,
    transact_leaving_out,
)

EVENT_TEXT_CHARS = 1000  # of a question or note an event repeats: the item stays one write unit or two
WRITE_ATTEMPTS = 25  # seq/step moves of a busy task between a read and a write; each try is one read and one write


@dataclass(frozen=True)
class NewEvent:
    """An event to log with a META change: ``type`` (``task.status``, ``task.retry``, ...) and
    its ``data`` (small: it is one item of the task's partition)."""

    type: str
    data: Mapping[str, Any] = field(default_factory=dict)


def logged_transact(
    table: Table,
    task_id: str,
    actions: Sequence[Action],
    event: NewEvent | Sequence[NewEvent],
    *,
    meta: str = "meta",
    retry_moved: bool = True,
    read: Item | None = None,
) -> Item | None:
    """Run ``actions`` as one transaction that also logs ``event``; returns META as read before.
    ``event`` may be several, logged in order by the same write (a message that raises the
    budget: ``budget.raised`` then ``message.received``), as one change that is two to a watcher.

    ``actions`` must hold exactly one action on the task's META, named ``meta`` (a ``Patch`` or
    a ``Check``): it gets ``seq = :s + 1`` and the condition ``seq = :s AND step = :k`` merged
    in, and a ``Put`` of ``EVENT#<s+1>`` joins the transaction. A refusal when ``seq`` or
    ``step`` had moved since the read is retried with the new values; any other refusal raises
    ``TransactionCancelled`` as the transaction without the event would have. A caller whose own
    condition reads a counter that moves with ``seq`` (a message's number) passes
    ``retry_moved=False``: every refusal is then ``TransactionCancelled``, and it reads again.

    ``read``: META as the caller read it already (a stop's batch read of the tasks it fences):
    the first attempt writes from it instead of reading META again, one round trip fewer. As
    that read may be older, the attempt also requires META's ``status`` to be the one read (a
    claim moves it without moving ``seq``), so what is returned is what the write replaced; a
    refusal when it had moved is retried from a fresh read, as a moved ``seq`` is, and pinned
    again: a claim between that read and its write would otherwise be written over unseen.

    Each attempt is applied once, though its answer is lost after DynamoDB applied it (a 500, a
    connection reset, a read timeout) and botocore sends it again: the attempt's id is its
    ``ClientRequestToken`` (DynamoDB answers the retry as the write it applied) and its first
    event's ``write``; a retry refused (a store that ignores the token, as moto does) finds
    that event in its place and returns as the attempt would have. Else a lost answer was a
    move to write again: a budget raised twice, a message accepted twice, an approval decided
    and its person told there was none pending, a dead-letter's failure refused as not its own.
    """
    key = keys.meta_key(task_id)
    for attempt in range(WRITE_ATTEMPTS):
        current = read if attempt == 0 and read is not None else table.get(key)
        if current is None:
            raise TransactionCancelled(frozenset({meta}))
        head = plain(current)
        pinned = read is not None
        write = uuid.uuid4().hex  # this attempt, one request however often botocore sends it
        try:
            table.transact(_logged(task_id, actions, event, head, meta=meta, pinned=pinned, write=write), token=write)
            return current
        except TransactionConflict:
            if _landed(table, task_id, head, write):
                return current
            raise
        except TransactionCancelled as exc:
            logged = exc.failed & _event_names("event", len(_events(event)))
            if meta not in exc.failed and not logged:
                raise
            now = table.get(key)
            moved = now is not None and (int(now.get("step", 0)), int(now.get("seq", 0))) != _counters(head)
            if moved and _landed(table, task_id, head, write):
                return current  # this attempt went through; its answer was lost and its retry refused
            moved = moved or (pinned and now is not None and now.get("status") != head.get("status"))
            if not moved or not retry_moved:
                raise TransactionCancelled(exc.failed - logged or frozenset({meta})) from exc
    types = [e.type for e in _events(event)]
    raise RuntimeError(f"task {task_id} kept moving: its events {types} were not written")


@dataclass(frozen=True)
class LoggedWrite:
    """One task's write for ``logged_together``: its META ``Patch`` (or ``Check``), the event it
    logs, and META as the caller read it."""

    task_id: str
    action: Patch | Check
    event: NewEvent
    read: Item


TOGETHER = 50  # tasks a transaction: DynamoDB's 100 actions, two a task (META and its event)


def logged_together(table: Table, writes: Sequence[LoggedWrite]) -> list[bool]:
    """Up to ``TOGETHER`` tasks' logged writes in one transaction, each made from its ``read``
    with META's ``status``, ``seq`` and ``step`` pinned (as ``logged_transact(read=)``'s first
    attempt): one round trip for them all. A task whose condition fails (it moved since the
    read, or may not make this move) is left out and the others tried again; which were
    written, in order. The caller writes the others one by one (``logged_transact``, from a
    fresh read). A conflict with another write (``TransactionConflict``) leaves them all to it."""
    if len(writes) > TOGETHER:
        raise ValueError(f"at most {TOGETHER} tasks a transaction")

    def logged(i: int) -> list[Action]:
        write = writes[i]
        return _logged(write.task_id, [replace(write.action, name=f"meta{i}")], write.event, plain(write.read),
                       meta=f"meta{i}", pinned=True, event_name=f"event{i}")  # fmt: skip

    return transact_leaving_out(table, len(writes), logged)


def _counters(head: Mapping[str, Any]) -> tuple[int, int]:
    return int(head.get("step", 0)), int(head.get("seq", 0))


def _landed(table: Table, task_id: str, head: Mapping[str, Any], write: str) -> bool:
    """Whether the attempt ``write``, made from ``head``, was applied: its first event holds the
    place after ``head``'s ``seq`` (events are never rewritten, so later writes leave it there)."""
    first = table.get(keys.item_key(task_id, keys.event_sk(_counters(head)[1] + 1)))
    return first is not None and first.get("write") == write


def _events(event: NewEvent | Sequence[NewEvent]) -> list[NewEvent]:
    events = [event] if isinstance(event, NewEvent) else list(event)
    if not events:
        raise ValueError("a logged write logs at least one event")
    return events


def _logged(
    task_id: str,
    actions: Sequence[Action],
    event: NewEvent | Sequence[NewEvent],
    head: Mapping[str, Any],
    *,
    meta: str,
    pinned: bool,
    event_name: str = "event",
    write: str | None = None,
) -> list[Action]:
    """``actions`` with the event logged after META as ``head`` holds it: META's action (named
    ``meta``) gets ``seq + 1`` and the condition that ``seq`` and ``step`` (and with ``pinned``,
    ``status``) are still those, and a ``Put`` of ``EVENT#<seq+1>`` (named ``event_name``) joins.
    Several events take ``seq + 1 .. seq + n``, each its ``Put`` (the second named
    ``<event_name>2``, ...). ``write``: the attempt's id, kept on its first event."""
    key = keys.meta_key(task_id)
    step, seq = _counters(head)
    events = _events(event)
    held = _at(step, seq)
    if pinned:
        held = held & Attr("status").eq(head.get("status"))
    bump = Patch(meta, key, Update(set={"seq": seq + len(events)}), held)
    batch: list[Action] = []
    for action in actions:
        if action.name == meta:
            if not isinstance(action, Patch | Check) or action.key != key:
                raise ValueError(f"action {meta!r} must be a Patch or Check of {task_id}'s META")
            batch.append(merge(meta, action, bump))
        else:
            batch.append(action)
    at = time.time()
    puts: list[Action] = []
    for i, logged in enumerate(events, start=1):
        item = {
            **keys.item_key(task_id, keys.event_sk(seq + i)),
            "seq": seq + i,
            "after_step": step,
            "type": logged.type,
            "at": at,
            "data": dict(logged.data),
            **({"write": write} if write is not None and i == 1 else {}),
        }
        puts.append(Put(_event_name(event_name, i), item, absent()))
    return [*batch, *puts]


def _event_name(first: str, i: int) -> str:
    return first if i == 1 else f"{first}{i}"


def _event_names(first: str, n: int) -> frozenset[str]:
    return frozenset(_event_name(first, i) for i in range(1, n + 1))


def _at(step: int, seq: int) -> ConditionBase:
    held = Attr("seq").eq(seq) if seq else Attr("seq").not_exists() | Attr("seq").eq(0)
    return held & Attr("step").eq(step)
