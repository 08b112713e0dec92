"""One poller per watched task per process: the table's reads a task's event streams share.

Why a poller per task rather than per client: a watcher learns of a change by reading META, and
a thousand clients of one task reading it each would multiply the table's reads by a thousand.
A ``TaskPoller`` reads META (one strongly consistent GetItem) every ``interval`` and the new
items only when META's step, seq, epoch, status or live text changed; it keeps what it read in a
buffer that every subscriber of the task takes its events from, until every subscriber has taken
it (and no more than ``BUFFER_BYTES``: memory follows the slowest subscriber's lag, not the task's
history). A subscriber behind the buffer reads its own way up from the table first
(``api/event_hub.py``, which serves the streams from these pollers).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from agentq.api.events import READ_PAGE, event_bytes
from agentq.storage.container import Storage
from agentq.storage.events import Head, LogEvent, Position

# Per task, a poller holds only what a subscriber has not taken yet, and at most this much of it
# (the last read's events always): a subscriber further behind reads the table itself.
BUFFER_EVENTS = 2000
BUFFER_BYTES = 128_000  # of events and their frames: 5,000 slow streams of 5,000 tasks hold 640 MB at most


@dataclass(frozen=True)
class Snapshot:
    head: Head | None
    read_at: float | None  # when that META was read
    base: Position | None  # the buffer holds every event after this up to ``through``
    through: Position | None
    events: list[LogEvent]


class TaskPoller:
    def __init__(
        self,
        store: Storage,
        task_id: str,
        interval: float,
        linger: float = 10.0,
        on_stop: Any = None,
        idle_interval: float | None = None,
    ) -> None:
        self.store = store
        self.task_id = task_id
        self.interval = interval
        # Fed by the table's stream (api/stream_feed.py): read when nudged, else only every
        # ``idle_interval`` (a safety net), unless a tree's watch needs its reads' times fresh.
        self.idle_interval = idle_interval
        self.nudged = threading.Event()
        self.eager = 0  # tree watches that hold events by this poller's read times (EventHub._hold)
        self.strong = True  # the next read is strongly consistent (off: a live-text-only nudge)
        self.linger = linger
        self.on_stop = on_stop  # called once the poller has stopped for want of subscribers
        self.lock = threading.Lock()
        # each subscriber's place: what it had of the task at its last look (None: not known yet)
        self.subscribers: dict[threading.Event, Position | None] = {}
        self.head: Head | None = None
        self.read_at: float | None = None
        self.base: Position | None = None
        self.through: Position | None = None
        self.buffer: list[LogEvent] = []
        self.frames: dict[Position, str] = {}  # the frame of each buffered event, for one-task watches
        self.sizes: list[int] = []  # of each buffered event
        self.held = 0  # bytes of the buffered events and frames
        self.fresh: Position | None = None  # the buffer's events after this came with the last read
        self.stopped = threading.Event()
        self.reads = 0  # table calls made (bench/events.py)
        self.idle_since: float | None = None
        self.last_read = time.monotonic()
        self.thread = threading.Thread(target=self._run, name=f"events-{task_id[:8]}", daemon=True)

    def start(self) -> TaskPoller:
        read_at = time.time()
        head = self.store.events.head(self.task_id)
        self.reads += 1
        with self.lock:
            self.head, self.read_at = head, read_at
            self.base = self.through = head.position if head else None
        self.thread.start()
        return self

    def _period(self) -> float:
        return self.interval if self.idle_interval is None or self.eager else self.idle_interval

    def _due(self) -> float:
        return max(0.0, self.last_read + self._period() - time.monotonic())

    def _run(self) -> None:
        while True:
            nudged = self.nudged.wait(self._due())
            self.nudged.clear()
            if self.stopped.is_set():
                return
            with self.lock:
                idle = self.idle_since is not None and time.monotonic() - self.idle_since > self.linger
                if idle:
                    self.stopped.set()  # no subscriber for a while: stop reading the table
            if idle:
                if self.on_stop is not None:
                    self.on_stop(self)
                return
            if not nudged and self._due() > 0:
                continue  # the last tree watch stopped holding events by it mid-wait: wait out the longer period
            with self.lock:
                strong = self.idle_interval is None or self.strong or self.eager > 0 or not nudged
                self.strong = False
            try:
                self.poll(consistent=strong)
            except Exception:  # a failed read is retried at the next tick; the stream stays up
                time.sleep(self.interval)
            self.last_read = time.monotonic()

    def poll(self, *, consistent: bool = True) -> None:
        """Read META, and the log after ``through`` when it moved. An eventually consistent read
        (``consistent=False``) that returns an older META than the last is dropped."""
        read_at = time.time()  # before the read: a tree's watch holds events by it (api/events.py)
        head = self.store.events.head(self.task_id, consistent=consistent)
        self.reads += 1
        if not consistent and (
            head is None
            or (
                self.head is not None and (head.position < self.head.position or head.updated_at < self.head.updated_at)
            )
        ):
            return  # stale: the strong read that follows the change it missed will see it
        if head is not None and self.head is not None and head.fingerprint == self.head.fingerprint:
            with self.lock:
                self.read_at = read_at
                self._trim()
            return
        new: list[LogEvent] = []
        moved = head is not None and (
            self.head is None or head.position != self.head.position or head.status != self.head.status
        )
        if moved and head is not None:  # the live text alone changed: nothing new in the log
            after = self.through
            while True:
                page = self.store.events.read(self.task_id, head, after, limit=READ_PAGE)
                self.reads += 1
                new += page
                if len(page) < READ_PAGE:
                    break
                after = page[-1].position
        sizes = [event_bytes(e) for e in new]
        with self.lock:
            self.head, self.read_at = head, read_at
            if head is not None:
                if self.base is None:
                    self.base = head.position
                if new:
                    self.fresh = self.through
                self.buffer += new
                self.sizes += sizes
                self.held += sum(sizes)
                self.through = head.position
                self._trim()
            waiting = list(self.subscribers)
        for wake in waiting:
            wake.set()

    def _trim(self) -> None:
        """(Under the lock.) Drop the events every subscriber had at its last look (all of them
        with none attached), then the oldest while over the caps, never the last read's (every
        subscriber keeping up needs those). Why by what was taken: a task's history is not what
        its watchers need, and 150 turns of 20 KB results held for a caught-up subscriber are
        7.8 MB. A subscriber the caps passed reads its own way up from the table (``seen < base``)."""
        known = [p for p in self.subscribers.values() if p is not None]
        floor = self.through if not self.subscribers else min(known) if len(known) == len(self.subscribers) else None
        n = 0
        while n < len(self.buffer):
            at = self.buffer[n].position
            over = self.held > BUFFER_BYTES or len(self.buffer) - n > BUFFER_EVENTS
            if not ((floor is not None and at <= floor) or (over and (self.fresh is None or at <= self.fresh))):
                break
            self.held -= self.sizes[n] + len(self.frames.pop(at, ""))
            n += 1
        if n:
            self.base = self.buffer[n - 1].position
            del self.buffer[:n], self.sizes[:n]

    def snapshot(self, after: Position | None, wake: threading.Event | None = None) -> Snapshot:
        """The buffer's events after ``after``; ``wake``'s subscriber has everything up to it
        (the poller's next read drops what all have)."""
        with self.lock:
            if wake in self.subscribers:
                self.subscribers[wake] = after
            events = [e for e in self.buffer if after is None or e.position > after]
            return Snapshot(self.head, self.read_at, self.base, self.through, events)

    def share(self, position: Position, text: str) -> None:
        """Keep the frame of a buffered event for the task's other one-task watches."""
        with self.lock:
            if self.base is not None and position > self.base and position not in self.frames:
                self.frames[position] = text
                self.held += len(text)
