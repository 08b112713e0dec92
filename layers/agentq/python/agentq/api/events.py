"""What a watcher of a task (or of its tree) receives: the task's event log (``storage/events.py``)
as JSON events, their ids (cursors), and one read of what follows a cursor.

An event is ``{"id", "type", "task_id", "at", "committed", "data"}``. Its id is where it stands
in the log: ``<task_id>:<step>.<seq>.<rank>.<sub>`` for one task; for a tree, ``tree:`` and the
position of every task of the tree reached so far (base64 of JSON), so the one id a client sends
back (``Last-Event-ID``) resumes every task where it was. Uncommitted output (the live text of a
model call in flight) is ``committed: false`` with ``id: null``: it moves no cursor, and the
committed step that follows supersedes it.

Types: ``task.created``, ``task.status`` (``data.status``; a claim adds ``epoch``, ``worker``,
``takeover``), ``agent.message`` (a committed LLM call: model, tokens, cost, text),
``agent.tool_results`` (a committed tools step: each call with a summary of its input and
output), ``task.retry`` (a retry or deferral with its reason), ``approval.requested``,
``approval.decided``, ``task.spawned`` (the children's ids), ``budget.raised``,
``message.received`` (a person's message accepted: its ``seq`` and text; a follow-up's adds
``status: queued``), ``user.message`` (messages delivered into the conversation: a committed
step), ``task.interrupt_requested``, ``conversation.closed``, and ``agent.message_delta``
(uncommitted). Any event whose data has a ``status`` leaves the task in it.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from agentq.api.views import InvalidCursor, step_views
from agentq.core.errors import TaskNotFound
from agentq.core.models import LLMStep, MessageStep, Task
from agentq.storage.container import Storage
from agentq.storage.events import Head, LogEvent, Position

TREE = "tree:"
MAX_TREE_TASKS = 200  # a tree cursor names each task: it stays a header a proxy passes


def parse_cursor(task: Task, cursor: str | None, *, tree: bool, field: str) -> dict[str, Position | None]:
    """The position of each watched task after ``cursor`` (None: from the start). A cursor of
    another task or tree, or one this API did not issue, is ``InvalidCursor`` naming ``field``."""
    if not cursor:
        return {task.task_id: None}
    if tree != cursor.startswith(TREE):
        kind = "a tree's" if cursor.startswith(TREE) else "one task's"
        raise InvalidCursor(
            f"{field}: {kind} event id; {'pass tree=true' if not tree else 'drop tree=true'}", field=field
        )
    if not tree:
        owner, sep, pos = cursor.partition(":")
        if not sep or owner != task.task_id:
            raise InvalidCursor(f"{field}: not an event id of task {task.task_id}", field=field)
        return {task.task_id: _position(pos, field)}
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor[len(TREE) :] + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidCursor(f"{field}: not an event id this API issued", field=field) from None
    if not isinstance(data, dict) or data.get("r") != task.task_id or not isinstance(data.get("p"), dict):
        raise InvalidCursor(f"{field}: not an event id of the tree of task {task.task_id}", field=field)
    positions: dict[str, Position | None] = {}
    for task_id, pos in data["p"].items():
        if not isinstance(task_id, str) or not isinstance(pos, str) or len(positions) >= MAX_TREE_TASKS:
            raise InvalidCursor(f"{field}: not an event id this API issued", field=field)
        positions[task_id] = _position(pos, field) if pos else None
    if task.task_id not in positions:
        raise InvalidCursor(f"{field}: not an event id of the tree of task {task.task_id}", field=field)
    return positions


def _position(text: str, field: str) -> Position:
    try:
        return Position.parse(text)
    except ValueError:
        raise InvalidCursor(f"{field}: {text[:40]!r} is not an event position this API issued", field=field) from None


def tree_cursor(root: str, positions: dict[str, Position | None]) -> str:
    raw = json.dumps({"r": root, "p": {t: (str(p) if p else "") for t, p in positions.items()}}, separators=(",", ":"))
    return TREE + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@dataclass
class Watched:
    """One task of a watch: what has been sent of it, and the tool inputs its next tools step names."""

    task_id: str
    cursor: Position | None
    seen: Position | None = None  # everything of the task up to here has been sent
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    done: bool = False  # terminal, and nothing after ``seen``
    live: tuple[int, int, str] | None = None  # (step, epoch, text) of the live text sent

    def __post_init__(self) -> None:
        self.seen = self.cursor


class Watch:
    """The tasks a client watches (one, or a tree) and its place in each. ``event_id`` of an
    event is the cursor that resumes after it."""

    def __init__(
        self, store: Storage, task: Task, positions: dict[str, Position | None], *, tree: bool, field: str = "after"
    ) -> None:
        """``field``: where the client sent the cursor (``after`` or ``Last-Event-ID``), which an
        error about it names."""
        self.store = store
        self.field = field
        self.root = task.task_id
        self.tenant = task.tenant
        self.tree = tree
        self.tasks: dict[str, Watched] = {t: Watched(t, p) for t, p in positions.items()}
        if tree:
            for task_id in list(self.tasks):
                if task_id != self.root:
                    self._check_in_tree(task_id)

    def _check_in_tree(self, task_id: str) -> None:
        try:
            child = self.store.tasks.get(task_id)
        except TaskNotFound:
            child = None
        if child is None or child.tenant != self.tenant or child.root_id != self.root:
            raise InvalidCursor(f"{self.field}: task {task_id} is not in the tree of {self.root}", field=self.field)

    def cursor(self) -> str:
        if self.tree:
            return tree_cursor(self.root, {t: w.cursor for t, w in self.tasks.items()})
        cursor = self.tasks[self.root].cursor
        return f"{self.root}:{cursor}" if cursor else ""

    @property
    def done(self) -> bool:
        return all(w.done for w in self.tasks.values())

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
                if child not in self.tasks and len(self.tasks) < MAX_TREE_TASKS:
                    self.tasks[child] = Watched(child, None)
        return {
            "id": self.cursor(),
            "type": kind,
            "task_id": watched.task_id,
            "at": event.at,
            "committed": True,
            "data": data,
        }

    def prime_inputs(self, watched: Watched, head: Head) -> None:
        """A watch resumed after an LLM step needs that step's tool inputs for the tools step after it."""
        cursor = watched.cursor
        if cursor is None or watched.inputs or cursor.step < 1 or cursor.step > head.step:
            return
        record = self.store.steps.last(watched.task_id, upto=cursor.step)
        if record is not None and isinstance(record.body, LLMStep):
            watched.inputs = {u["id"]: u.get("input") or {} for u in record.body.tool_uses()}

    def delta(self, watched: Watched, head: Head) -> dict[str, Any] | None:
        """The live text of the model call in flight, as what is new since the last sent
        (``reset``: the text starts over, for a new step or a new lease)."""
        if head.status.value != "running" or not head.live_text:
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
            "at": head.updated_at,
            "committed": False,
            "data": {"step": step, "epoch": epoch, "text": chunk, "reset": reset},
        }


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
    """Up to ``limit`` committed events after the watch's cursors, read from the table now
    (META first, then the items up to it), and marks each task done when it has ended and
    nothing follows."""
    out: list[dict[str, Any]] = []
    for watched in list(watch.tasks.values()):
        if len(out) >= limit:
            break
        head = watch.store.events.head(watched.task_id)
        if head is None:
            watched.done = True  # purged: it has nothing more to say
            continue
        if watched.cursor is not None and watched.cursor > head.position:
            raise InvalidCursor(
                f"{watch.field}: event {watched.cursor} of task {watched.task_id} is past its end", field=watch.field
            )
        watch.prime_inputs(watched, head)
        room = limit - len(out)
        events = watch.store.events.read(watched.task_id, head, watched.seen, limit=room)
        out += [watch.view(watched, e) for e in events]
        if len(events) < room:  # all of it up to the head
            watched.seen = max(watched.seen, head.position) if watched.seen else head.position
            watched.done = head.status.terminal
    return out
