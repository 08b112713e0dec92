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
  ``after_step = k``. That write, its retries and its one request per attempt are
  ``storage/event_writes.py`` (``logged_transact``), the one place events are written.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from agentq.core.models import StepRecord
from agentq.core.status import TaskStatus
from agentq.storage import keys
from agentq.storage.table import Item, Table, plain

RANK_STEP, RANK_FINISH, RANK_EVENT, RANK_CLAIM = 0, 1, 2, 3
_POSITION = re.compile(r"([0-9]{1,9})\.([0-9]{1,12})\.([0-3])\.([0-9]{1,9})")  # ASCII digits, fullmatch


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

    def consistent(self, task_id: str, head: Head, at: Position) -> bool:
        """Whether ``at`` can be a position of the log ``head`` ends: its ``seq`` reached, and
        its ``step`` where events ``seq`` and ``seq + 1`` place it (an event's own; a claim's or
        a step's after the first, and not after the second). An id whose parts each fit but not
        together (a seq ahead of its step) made ``read`` start at the wrong events: ids never
        issued, events left out. One Query of those two small items (none before any event)."""
        if at.seq > head.seq or (at.rank != RANK_CLAIM and at.sub != 0):
            return False
        around: dict[int, int] = {}  # after_step of events seq and seq + 1, by seq
        if head.seq:
            span = (keys.event_sk(max(at.seq, 1)), keys.event_sk(at.seq + 1))
            found = self.table.query(keys.task_pk(task_id), between=span, attributes=("seq", "after_step"))
            around = {int(e["seq"]): int(e["after_step"]) for e in found}
        if at.seq and at.seq not in around:
            return False
        if at.rank == RANK_EVENT:
            fits = around[at.seq] == at.step if at.seq else at == CREATED
        else:  # a claim found ``step`` after event ``seq``; step ``step`` committed after it
            fits = not at.seq or (around[at.seq] <= at.step if at.rank == RANK_CLAIM else around[at.seq] < at.step)
        return fits and around.get(at.seq + 1, at.step) >= at.step

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
