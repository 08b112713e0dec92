"""What a watcher of a task (or of its tree) receives: the task's event log (``storage/events.py``)
as JSON events, their ids (cursors), the order of a tree's events, and one read of what follows
a cursor.

An event is ``{"id", "type", "task_id", "tree_path", "user", "at", "committed", "data"}`` (``user``:
the end user the watched task acts for, which its whole tree shares). Its id is where
the watch stands after it: ``<task_id>:<step>.<seq>.<rank>.<sub>`` for one task; for a tree, the
root's position and each sub-agent's by its place in the tree (``api/tree_cursor.py``), so the one
id a client sends back (``Last-Event-ID``) resumes every task where it was. Uncommitted output
(the live text of a model call in flight) is ``committed: false`` with ``id: null``: it moves no
cursor, and the committed step that follows supersedes it.

**A tree's order.** Each task's events come in its own commit order (exact: positions). Across
tasks they are merged by time: the next event sent is, of every task's next one, the one with the
earliest ``at`` (then the shallower path, then the position), and a sub-agent's events come only
after the ``task.spawned`` that names it. That is a function of the committed events alone, so a
replay of a finished tree sends the same sequence, with the same ids, as the live stream did, and
a parent's ending comes after the work of the sub-agents it waited for. To keep to it live, an
event is held until every other open task of the tree has been read ``SETTLE`` seconds after the
event's time (an event is stamped just before its write commits): an event that commits later
than that with an earlier time still reaches the watcher, after the others, and its id, like every
id, says exactly what was sent, so a resume loses and repeats nothing either way; only the ids
around it differ from a replay's.

Types: ``task.created``, ``task.status`` (``data.status``; a claim adds ``epoch``, ``worker``,
``takeover``), ``agent.message`` (a committed LLM call: model, tokens, cost, text),
``agent.tool_results`` (a committed tools step: each call with a summary of its input and
output), ``task.retry`` (a retry or deferral with its reason), ``approval.requested``,
``approval.decided``, ``task.spawned`` (the children's ids), ``budget.raised``,
``message.received`` (a person's message accepted: its ``seq`` and text; a follow-up's adds
``status: queued``), ``user.message`` (messages delivered into the conversation: a committed
step), ``agent.grade`` (an answer graded against the task's outcome: attempt, score, bar, passed,
feedback, the grading model's tokens and cost), ``task.interrupt_requested``, ``conversation.closed``,
``agent.moved`` (its owner moved it to another version of its agent: ``from``, ``to``), and
``agent.message_delta`` (uncommitted). Any event whose data has a ``status`` leaves the task in it.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agentq.api.tree_cursor import MAX_TREE_TASKS, Path, TreeCursor, path_text
from agentq.api.views import InvalidCursor, step_views
from agentq.core.models import GradeStep, LLMStep, MessageStep, Task
from agentq.storage.container import Storage
from agentq.storage.events import Head, LogEvent, Position

SETTLE = 1.0  # seconds: how far behind its reads of the other tasks a tree's event is held (see the module)
READ_PAGE = 200
# A stream reading its own way up (``EventHub``: a resume from an old id, a stream from the start)
# holds at most about this much of events read and not yet sent (one event more, if larger), a
# task at a time: not a page of 200 (200 turns of 15 KB held 9.5 MB a stream while written to a
# slow client). The events per read follow their size, starting at ``FIRST_PAGE``.
CATCH_UP_BYTES = 64_000
FIRST_PAGE = 16


@dataclass
class Watched:
    """One task of a watch: what has been sent of it, what has been read and not yet sent, and
    the tool inputs its next tools step names."""

    task_id: str
    cursor: Position | None  # everything of the task up to here has been sent
    path: Path = ()
    seen: Position | None = None  # ... and up to here read (sent, or in ``pending``)
    pending: deque[LogEvent] = field(default_factory=deque)
    read_at: float | None = None  # when META was read that ``seen`` reached; None: not read, or more to read
    terminal: bool = False  # as of that read
    gone: bool = False  # no such task (purged, or a spawned child not written yet)
    children: int = 0  # sub-agents its sent ``task.spawned`` events named: the next one's path is this + 1
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    primed: bool = False
    live: tuple[int, int, str] | None = None  # (step, epoch, text) of the live text sent
    page: int = FIRST_PAGE  # events a read bounded by bytes asks for: what fitted the last one

    def __post_init__(self) -> None:
        self.seen = self.cursor

    @property
    def done(self) -> bool:
        """Ended (or absent), all of it read and sent."""
        return self.read_at is not None and not self.pending and (self.terminal or self.gone)

    def absorb(self, head: Head, events: list[LogEvent], *, complete: bool, read_at: float) -> None:
        """Events read after ``seen`` up to ``head`` (all of them if ``complete``, read from a
        META read at ``read_at``), queued to be sent."""
        self.gone = False
        self.pending.extend(events)
        if complete:
            self.seen = max(self.seen, head.position) if self.seen else head.position
            self.read_at, self.terminal = read_at, head.status.terminal
        elif events:
            self.seen, self.read_at = events[-1].position, None


class Watch:
    """The tasks a client watches (one, or a tree) and its place in each. ``cursor()`` after an
    event is that event's id: the cursor that resumes after it."""

    def __init__(self, store: Storage, task: Task, *, tree: bool, field: str = "after", settle: float = SETTLE) -> None:
        self.store = store
        self.root = task.task_id
        self.user = task.user  # a tree acts for one user: its root's
        self.tree = tree
        self.field = field  # what carried the cursor (``after`` or ``Last-Event-ID``), for its errors
        self.settle = settle
        self.tasks: dict[str, Watched] = {task.task_id: Watched(task.task_id, None)}
        self.opened = time.time()  # after the task was read: a read of "no such task" older than this is stale

    @classmethod
    def open(
        cls, store: Storage, task: Task, cursor: str | None, *, tree: bool, field: str, settle: float = SETTLE
    ) -> Watch:
        """The watch of ``task`` (or its tree) after ``cursor`` (None: from the start). A cursor
        of another task or tree, past a task's end, or one this API did not issue (its parts
        each in range but not together: ``EventLog.consistent``, a Query of two events for each
        task it names), is ``InvalidCursor`` naming ``field``; a sub-agent it names that is gone
        since is left out."""
        watch = cls(store, task, tree=tree, field=field, settle=settle)
        if not cursor:
            return watch
        is_tree = cursor.startswith("tree:")
        if tree != is_tree:
            kind = "a tree's" if is_tree else "one task's"
            raise InvalidCursor(
                f"{field}: {kind} event id; {'pass tree=true' if not tree else 'drop tree=true'}", field=field
            )
        if tree:
            watch._resume_tree(TreeCursor.parse(cursor, field))
        else:
            owner, sep, pos = cursor.partition(":")
            if not sep or owner != task.task_id:
                raise InvalidCursor(f"{field}: not an event id of task {task.task_id}", field=field)
            watch._at(watch.tasks[task.task_id], _position(pos, field))
        for watched in watch.tasks.values():
            if watched.cursor is None:
                continue
            head = store.events.head(watched.task_id)
            if head is None and watched.path:
                # A sub-agent purged since (``agentq purge``, its retention's TTL): it has nothing
                # more to send, and the rest of the tree resumes. Refused, the id never resumed again.
                watched.gone = True
                continue
            name = f"sub-agent {path_text(watched.path)}" if watched.path else f"task {watched.task_id}"
            if head is None or watched.cursor > head.position:
                raise InvalidCursor(f"{field}: event {watched.cursor} of {name} is past its end", field=field)
            if not store.events.consistent(watched.task_id, head, watched.cursor):  # one small Query
                raise InvalidCursor(f"{field}: {watched.cursor} is not an event id of {name} this API issued",
                                    field=field)  # fmt: skip
        return watch

    def _at(self, watched: Watched, position: Position | None) -> None:
        watched.cursor = watched.seen = position

    def _resume_tree(self, cursor: TreeCursor) -> None:
        """The tasks of the tree the cursor names, each where it was: a sub-agent's path is
        turned back into its task through its parent's spawn events up to the parent's position."""
        if cursor.root != self.root:
            raise InvalidCursor(
                f"{self.field}: an event id of the tree of task {cursor.root}, not of {self.root}", field=self.field
            )
        full = len(cursor.children) + 1 == MAX_TREE_TASKS  # then every task of the watch is listed
        found: dict[Path, str] = {}
        frontier = [self.tasks[self.root]]
        self._at(frontier[0], cursor.position)
        while frontier:
            parent = frontier.pop(0)
            if parent.cursor is None:
                continue
            kids = [c for spawn in self.store.events.spawned(parent.task_id, parent.cursor) for c in spawn]
            parent.children = len(kids)
            for i, child in enumerate(kids, 1):
                path = (*parent.path, i)
                found[path] = child
                if child in self.tasks or (full and path not in cursor.children):
                    continue
                if not full and len(self.tasks) >= MAX_TREE_TASKS - 1:
                    raise InvalidCursor(
                        f"{self.field}: not an event id this API issued (too many tasks)", field=self.field
                    )
                watched = Watched(child, None, path)
                self._at(watched, cursor.children.get(path))
                self.tasks[child] = watched
                frontier.append(watched)
        unknown = [p for p in cursor.children if p not in found]
        if unknown:
            raise InvalidCursor(
                f"{self.field}: the tree of {self.root} has no sub-agent {path_text(unknown[0])} at that point",
                field=self.field,
            )

    def cursor(self) -> str:
        """The id that resumes after everything sent so far ("" before anything)."""
        root = self.tasks[self.root].cursor
        if root is None:
            return ""
        if not self.tree:
            return f"{self.root}:{root}"
        full = len(self.tasks) >= MAX_TREE_TASKS
        children = {w.path: w.cursor for w in self.tasks.values() if w.path and (w.cursor is not None or full)}
        return str(TreeCursor(self.root, root, children))

    @property
    def done(self) -> bool:
        return all(w.done for w in self.tasks.values())

    def read(self, watched: Watched, *, limit: int = READ_PAGE, max_bytes: int | None = None) -> bool:
        """Read the task's next events from the table (META, then what follows ``seen`` up to
        it) into ``pending``; True if more remain to read. ``max_bytes``: keep only the events
        that fit it (at least one; the rest are read again next time) and ask next time for as
        many as fitted this time's sizes, at most twice as many as this time."""
        read_at = time.time()  # before the read: what commits after it is stamped later (see the module)
        head = self.store.events.head(watched.task_id)
        if head is None:
            watched.gone, watched.read_at = True, read_at  # purged, or not written yet
            return False
        self.prime_inputs(watched, head)
        if max_bytes is not None:
            limit = min(limit, watched.page)
        events = self.store.events.read(watched.task_id, head, watched.seen, limit=limit)
        complete = len(events) < limit
        if max_bytes is not None and events:
            sizes = [event_bytes(e) for e in events]
            kept, held = 1, sizes[0]
            while kept < len(sizes) and held + sizes[kept] <= max_bytes:
                held, kept = held + sizes[kept], kept + 1
            if kept < len(events):
                events, complete = events[:kept], False
            watched.page = max(1, min(READ_PAGE, 2 * limit, max_bytes * len(sizes) // max(1, sum(sizes))))
        watched.absorb(head, events, complete=complete, read_at=read_at)
        return not complete

    def ready(self) -> tuple[Watched, LogEvent] | None:
        """The next event in the watch's order, if it may be sent now (see the module)."""
        best: tuple[tuple[float, Path, Position], Watched] | None = None
        for w in self.tasks.values():
            if w.pending:
                e = w.pending[0]
                key = (e.at, w.path, e.position)
                if best is None or key < best[0]:
                    best = (key, w)
        if best is None:
            return None
        at, chosen = best[0][0], best[1]
        for other in self.tasks.values():
            if other is chosen or other.pending or (other.terminal and other.read_at is not None):
                continue  # its next event is a candidate already, or it has ended
            if other.read_at is None or at > other.read_at - self.settle:
                return None  # unread, or something of it may still commit before this
        return chosen, chosen.pending[0]

    def take(self, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` events that may be sent now, in order, as sent."""
        out: list[dict[str, Any]] = []
        while len(out) < limit:
            nxt = self.ready()
            if nxt is None:
                break
            watched, event = nxt
            watched.pending.popleft()
            out.append(self.view(watched, event))
        return out

    def view(self, watched: Watched, event: LogEvent) -> dict[str, Any]:
        """The event as sent; moves the task's cursor past it (and adds a spawn's children)."""
        watched.cursor = event.position
        if watched.seen is None or event.position > watched.seen:
            watched.seen = event.position
        data = dict(event.data)
        kind = event.type
        if event.step is not None:
            record = event.step
            views = step_views(record, watched.inputs)
            if isinstance(record.body, LLMStep):
                watched.inputs = {u["id"]: u.get("input") or {} for u in record.body.tool_uses()}
                kind, data = "agent.message", views[0].model_dump(mode="json")
            elif isinstance(record.body, MessageStep):  # a person's messages, now in the conversation
                kind, data = (
                    "user.message",
                    {"step": record.number, "messages": [v.model_dump(mode="json") for v in views]},
                )
            elif isinstance(record.body, GradeStep):  # the answer's grade against the task's outcome
                kind, data = "agent.grade", views[0].model_dump(mode="json")
            elif views and views[0].type == "llm_call":
                kind, data = "agent.message", views[0].model_dump(mode="json")  # a compaction
            else:
                kind, data = (
                    "agent.tool_results",
                    {"step": record.number, "tool_calls": [v.model_dump(mode="json") for v in views]},
                )
            watched.live = None  # the step supersedes the live text sent before it
        if kind == "task.spawned" and self.tree:
            for child in data.get("children", []):
                watched.children += 1
                if child not in self.tasks and len(self.tasks) < MAX_TREE_TASKS:
                    self.tasks[child] = Watched(child, None, (*watched.path, watched.children))
        return {
            "id": self.cursor(),
            "type": kind,
            "task_id": watched.task_id,
            "tree_path": path_text(watched.path) if self.tree else None,
            "user": self.user,
            "at": event.at,
            "committed": True,
            "data": data,
        }

    def prime_inputs(self, watched: Watched, head: Head) -> None:
        """A watch resumed after an LLM step needs that step's tool inputs for the tools step after it."""
        cursor = watched.cursor
        if watched.primed or cursor is None or watched.inputs or cursor.step < 1 or cursor.step > head.step:
            watched.primed = True
            return
        watched.primed = True
        record = self.store.steps.last(watched.task_id, upto=cursor.step)
        if record is not None and isinstance(record.body, LLMStep):
            watched.inputs = {u["id"]: u.get("input") or {} for u in record.body.tool_uses()}

    def delta(self, watched: Watched, head: Head) -> dict[str, Any] | None:
        """The live text of the model call in flight, as what is new since the last sent
        (``reset``: the text starts over, for a new step or a new lease). None while committed
        events of the task wait to be sent: the step they end with supersedes it."""
        if watched.pending or head.status.value != "running" or not head.live_text:
            return None
        step, epoch, text = head.step + 1, head.epoch, head.live_text
        sent = watched.live
        if sent is not None and sent[:2] == (step, epoch):
            if sent[2] == text:
                return None
            chunk, reset = _after(sent[2], text)
        else:
            chunk, reset = text, True
        watched.live = (step, epoch, text)
        return {
            "id": None,
            "type": "agent.message_delta",
            "task_id": watched.task_id,
            "tree_path": path_text(watched.path) if self.tree else None,
            "user": self.user,
            "at": head.updated_at,
            "committed": False,
            "data": {"step": step, "epoch": epoch, "text": chunk, "reset": reset},
        }


def event_bytes(event: LogEvent) -> int:
    """About the bytes an event holds (a step's record, which its frame repeats, dominates)."""
    return len(event.step.model_dump_json()) if event.step is not None else len(json.dumps(event.data, default=str))


def _position(text: str, field: str) -> Position:
    try:
        return Position.parse(text)
    except ValueError:
        raise InvalidCursor(f"{field}: {text[:40]!r} is not an event position this API issued", field=field) from None


def _after(old: str, new: str) -> tuple[str, bool]:
    """What ``new`` adds to ``old``, both tails of one growing text: the longest end of ``old``
    that begins ``new`` is shared. Nothing shared: the whole of ``new``, as a reset."""
    if new.startswith(old):
        return new[len(old) :], False
    for start in range(1, len(old)):
        if new.startswith(old[start:]):
            return new[len(old) - start :], False
    return new, True


def read_once(watch: Watch, *, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` committed events after the watch's cursors, read from the table now, in
    the watch's order (each task read at most once a page, unless more of it is needed)."""
    out: list[dict[str, Any]] = []
    while len(out) < limit:
        for watched in list(watch.tasks.values()):
            if not watched.pending and watched.read_at is None:
                watch.read(watched, limit=limit)
        got = watch.take(limit - len(out))
        if not got:
            break
        out += got
    return out
