"""A task's event log: every change a watcher may see, in commit order, resumable from any event.

Invariant: **each event is committed by the very write that makes the change it describes**, and
has a position in one total order that is the order those writes committed in. A reader that
reads META (strongly consistent) and then the items up to META's position is gap-free: nothing
can later commit at a position before one it has returned.

Where the events are:

- **A committed step is an event already**: ``STEP#n`` is committed iff ``n <= META.step``
  (``storage/steps.py``), so the step commit writes nothing more for the stream (the hot path
  stays one put and one update). A step that ends the task records the status it ends with
  (``finish``), which becomes a second event of the same item.
- **Every other change of META** (status transitions, retries and deferrals, approval requests
  and decisions, spawns, budget raises; later user messages and interrupts) is an ``EVENT#<seq>``
  item written in the same ``TransactWriteItems`` as the META change, which bumps META's ``seq``
  under the condition ``seq = :s AND step = :k`` (besides its own). The event records
  ``after_step = k``. A write refused only because ``seq`` or ``step`` moved re-reads META and
  tries again (``logged_transact``): that is the one place events are written. Each attempt is
  one request, applied once: its ``ClientRequestToken`` makes botocore's retry of it (after an
  answer lost once DynamoDB applied it) a replay, and its first event carries the same id
  (``write``), so a retry refused where the token is not honoured finds its own event and counts
  as done, never as a move to write again.
- **Claims** stay one ``UpdateItem`` (the hot path of every run): the claim copies META's
  ``step`` and ``seq`` as they were into ``claim_step``/``claim_seq`` (and the status it took the
  task from into ``claimed_from``), and its ``CLAIM#<epoch>`` record carries the same. The latest
  claim is read from META, and so is the one before it (``storage.leases.PREVIOUS_CLAIM``: a
  claim in the log stays there, though its claimer died before its record); older ones from
  their records.

Positions, compared as tuples ``(step, seq, rank, sub)``:

- step ``n``: ``(n, m, 0, 0)``, where ``m`` is the seq of the last event committed before it;
  its finishing status ``(n, m, 1, 0)``;
- an event with seq ``s`` written while ``META.step = k``: ``(k, s, 2, 0)``; it committed after
  step ``k`` and before step ``k+1`` (its condition held ``step = k``);
- a claim of epoch ``e`` that found ``step = k, seq = s``: ``(k, s, 3, e)``: after event ``s``,
  before event ``s+1`` and step ``k+1``; claims at the same ``(k, s)`` in epoch order;
- the task's creation: ``(0, 0, 2, 0)``.

An event id is its position written ``step.seq.rank.sub``: a cursor needs nothing else, because
the events before a position are exactly the steps up to ``step``, the events up to ``seq`` and
the claims before it. Uncommitted output (the live text of a model call in flight) is not in
the log: it has no position, and the API marks it as such (``api/events.py``).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.core.models import StepRecord
from agentq.core.status import TaskStatus
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

RANK_STEP, RANK_FINISH, RANK_EVENT, RANK_CLAIM = 0, 1, 2, 3
_POSITION = re.compile(r"([0-9]{1,9})\.([0-9]{1,12})\.([0-3])\.([0-9]{1,9})")  # ASCII digits, fullmatch
EVENT_TEXT_CHARS = 1000  # of a question or note an event repeats: the item stays one write unit or two
WRITE_ATTEMPTS = 25  # seq/step moves of a busy task between a read and a write; each try is one read and one write


@dataclass(frozen=True, order=True)
class Position:
    step: int
    seq: int
    rank: int
    sub: int = 0

    def __str__(self) -> str:
        return f"{self.step}.{self.seq}.{self.rank}.{self.sub}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """A position from its id; ValueError for anything this log did not issue."""
        m = _POSITION.fullmatch(text)
        if m is None:
            raise ValueError(f"{text!r} is not an event id")
        return cls(int(m[1]), int(m[2]), int(m[3]), int(m[4]))


CREATED = Position(0, 0, RANK_EVENT, 0)


@dataclass(frozen=True)
class NewEvent:
    """An event to log with a META change: ``type`` (``task.status``, ``task.retry``, ...) and
    its ``data`` (small: it is one item of the task's partition)."""

    type: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LogEvent:
    """An event as read back. ``step`` holds the step record of a step event."""

    position: Position
    type: str
    at: float
    data: dict[str, Any]
    step: StepRecord | None = None


@dataclass(frozen=True)
class Head:
    """What META says now: the log's end, and what a watcher polls for change."""

    step: int
    seq: int
    epoch: int
    status: TaskStatus
    live_text: str | None
    updated_at: float
    meta: Item

    @property
    def position(self) -> Position:
        return Position(self.step, self.seq, RANK_CLAIM, max(self.epoch, 0))

    @property
    def fingerprint(self) -> tuple[int, int, int, str, str | None]:
        return (self.step, self.seq, self.epoch, self.status.value, self.live_text)


def head_of(meta: Item) -> Head:
    m = plain(meta)
    return Head(
        step=int(m.get("step", 0)),
        seq=int(m.get("seq", 0)),
        epoch=int(m.get("lease_epoch", 0)),
        status=TaskStatus(m["status"]),
        live_text=m.get("live_text"),
        updated_at=float(m.get("updated_at", 0.0)),
        meta=m,
    )


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


StepDecoder = Callable[[str, Item], StepRecord]


class EventLog:
    """Reads a task's events in commit order after a position (see the module)."""

    def __init__(self, table: Table, decode_step: StepDecoder) -> None:
        self.table = table
        self.decode_step = decode_step

    def head(self, task_id: str, *, consistent: bool = True) -> Head | None:
        """META now (one strongly consistent GetItem), or None when there is no such task.
        ``consistent=False`` (half the read units) may return an older META: only for what a
        newer read supersedes anyway (the events hub's read of a live-text-only change)."""
        meta = self.table.get(keys.meta_key(task_id), consistent=consistent)
        return head_of(meta) if meta is not None else None

    def read(self, task_id: str, head: Head, after: Position | None, *, limit: int = 200) -> list[LogEvent]:
        """Events after ``after`` up to ``head``, in order, at most ``limit`` (then the rest
        from the last one returned). ``head`` must have been read before this call: what
        commits after it is left for the next read, which is what makes the order exact."""
        if after is not None and after > head.position:
            raise ValueError(f"position {after} is past the end of task {task_id}'s log")
        out: list[LogEvent] = []
        horizon = head.position
        if after is None or after < CREATED:
            out.append(self._created(task_id, head))
        base_seq = after.seq if after is not None else 0
        events: list[Item] = []
        if head.seq > base_seq:
            events = self._query_between(task_id, keys.event_sk(base_seq + 1), keys.event_sk(head.seq), limit)
            if len(events) == limit:  # more may follow: stop at the last one read
                last = plain(events[-1])
                horizon = min(horizon, Position(int(last["after_step"]), int(last["seq"]), RANK_CLAIM, 10**9 - 1))
        # The steps not sent yet: after the cursor's, or from its own when it stands at a step,
        # whose finish (its second event) may follow. Never one sent before: each read of a new
        # step would read them again, for nothing (the tool inputs a tools step's view names are
        # the watcher's, ``api.events.Watch.prime_inputs``).
        own = after is not None and after.rank == RANK_STEP
        first_step = 1 if after is None else after.step if own else after.step + 1
        steps: list[Item] = []
        if head.step >= first_step:
            want = limit + 1 if own else limit  # the cursor's own step (its finish), then ``limit`` more
            steps = self._query_between(task_id, keys.step_sk(max(1, first_step)), keys.step_sk(head.step), want)
            if len(steps) == want:
                horizon = min(horizon, Position(int(plain(steps[-1])["number"]) + 1, 0, 0, 0))
        logged = [plain(e) for e in events]
        for raw in logged:
            pos = Position(int(raw["after_step"]), int(raw["seq"]), RANK_EVENT)
            out.append(LogEvent(pos, str(raw["type"]), float(raw["at"]), dict(raw.get("data") or {})))
        seq_before = _SeqBefore(base_seq, [(int(e["after_step"]), int(e["seq"])) for e in logged])
        for raw in steps:
            record = self.decode_step(task_id, raw)
            pos = Position(record.number, seq_before(record.number), RANK_STEP)
            out.append(LogEvent(pos, "step", record.committed_at, {}, record))
            finish = raw.get("finish")
            if finish:
                data = {"status": finish, **({"error": raw["finish_error"]} if raw.get("finish_error") else {})}
                out.append(LogEvent(Position(pos.step, pos.seq, RANK_FINISH), "task.status", record.committed_at, data))
        out.extend(self._claims(task_id, head, after))
        out.sort(key=lambda e: e.position)
        ready = [e for e in out if (after is None or e.position > after) and e.position <= horizon]
        return ready[:limit]

    def spawned(self, task_id: str, upto: Position) -> list[list[str]]:
        """The children each ``task.spawned`` event of the task names, in commit order, up to
        ``upto``: a tree's cursor names a sub-agent by its place among its parent's children."""
        if upto.seq < 1:
            return []
        items = self.table.query(keys.task_pk(task_id), between=(keys.event_sk(1), keys.event_sk(upto.seq)))
        return [
            [str(c) for c in plain(e)["data"].get("children", [])] for e in items if e.get("type") == "task.spawned"
        ]

    def _query_between(self, task_id: str, low: str, high: str, limit: int) -> list[Item]:
        return self.table.query(keys.task_pk(task_id), between=(low, high), limit=limit)

    def _created(self, task_id: str, head: Head) -> LogEvent:
        sub = self.table.get(keys.submission_key(task_id))
        blocked = sub is not None and bool(json.loads(str(sub.get("submission", "{}"))).get("depends_on"))
        data: dict[str, Any] = {"status": TaskStatus.BLOCKED.value if blocked else TaskStatus.QUEUED.value}
        for name in ("parent_id", "root_id", "forked_from"):
            if head.meta.get(name):
                data[name] = head.meta[name]
        return LogEvent(CREATED, "task.created", float(head.meta.get("created_at", 0.0)), data)

    def _claims(self, task_id: str, head: Head, after: Position | None) -> Iterable[LogEvent]:
        """The claims after ``after``: the latest from META, the one before it from META too
        (``storage.leases.PREVIOUS_CLAIM``: its record may not be written yet, or its claimer
        died before writing it; it was in the log as the latest, so it stays), older ones from
        their records."""
        if head.epoch < 1 or "claim_step" not in head.meta:
            return []
        latest = Position(int(head.meta["claim_step"]), int(head.meta["claim_seq"]), RANK_CLAIM, head.epoch)
        if after is not None and latest <= after:
            return []
        found: dict[int, LogEvent] = {
            head.epoch: _claim_event(
                latest,
                float(head.meta.get("last_claimed_at", 0.0)),
                str(head.meta.get("lease_owner", "")),
                str(head.meta.get("claimed_from", "")),
            )
        }
        if head.epoch > 1 and int(head.meta.get("pc_n", -1)) >= 0:
            step, seq = int(head.meta["pc_n"]), int(head.meta["pc_s"])
            found[head.epoch - 1] = _claim_event(
                Position(step, seq, RANK_CLAIM, head.epoch - 1),
                float(head.meta["pc_at"]),
                str(head.meta.get("pc_w", "")),
                str(head.meta.get("pc_f", "")),
            )
        if head.epoch > 1:
            for raw in self.table.query(keys.task_pk(task_id), prefix=keys.CLAIM):
                c = plain(raw)
                epoch = int(c["epoch"])
                if epoch >= head.epoch or "step" not in c:
                    continue  # the latest is META's; a record from before positions is left out
                pos = Position(int(c["step"]), int(c["seq"]), RANK_CLAIM, epoch)
                found[epoch] = _claim_event(pos, float(c["at"]), str(c["worker"]), str(c.get("claimed_from", "")))
        return found.values()


def _claim_event(pos: Position, at: float, worker: str, claimed_from: str) -> LogEvent:
    data = {"status": TaskStatus.RUNNING.value, "epoch": pos.sub, "worker": worker}
    if claimed_from:
        data["takeover"] = claimed_from == TaskStatus.RUNNING.value
    return LogEvent(pos, "task.status", at, data)


class _SeqBefore:
    """The seq of the last event committed before step ``n``: the events are read in order."""

    def __init__(self, base: int, events: list[tuple[int, int]]) -> None:
        self.base = base
        self.events = events  # (after_step, seq), ascending

    def __call__(self, number: int) -> int:
        seq = self.base
        for after_step, s in self.events:
            if after_step < number:
                seq = max(seq, s)
        return seq
