"""Server-sent event streams of tasks, served from the process's pollers (``api/task_poller.py``:
one per watched task, whose buffer every subscriber of the task takes its events from). A
subscriber behind the buffer (a reconnect with an old ``Last-Event-ID``, or one the cap passed)
reads its own way up from the table first, then joins: whatever it reads is at positions the log never changes, so the two never disagree. A
tree's watch takes each task's events into its own queue and sends them in the tree's order
(``api/events.py``), holding one until the other tasks' pollers have read past its time.

A stream: each committed event (``id:`` its cursor, ``event:`` its type, ``data:`` the JSON
event; the first also carries ``retry:``, so no block of the stream is an event without data, which
some clients hand on as an empty event), the live text of a model call in flight as ``agent.message_delta``
without an id, a ``: keep-alive`` comment after ``keepalive`` seconds of silence, and the end
once every watched task has ended and all its events were sent (``event: end``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from agentq.api.events import CATCH_UP_BYTES, READ_PAGE, SETTLE, Watch, Watched
from agentq.api.stream_caps import StreamCaps
from agentq.api.task_poller import BUFFER_BYTES as BUFFER_BYTES  # the cap a poller holds, named here too
from agentq.api.task_poller import Snapshot, TaskPoller
from agentq.api.views import owned
from agentq.core.endusers import Caller
from agentq.core.models import LLMStep, ToolsStep
from agentq.storage.container import Storage
from agentq.storage.events import Head, LogEvent

RETRY = "retry: 1000\n"  # sent with the first event: a reconnect after a second
END = "event: end\ndata: {}\n\n"  # every watched task has ended: a client stops here (no reconnect)
# A stream's longest life, after which it ends without ``END`` and its client resumes from its
# last id (authorised again on the way in): the events function's is ``LIVE_SECONDS`` (840 s,
# under its 900 s timeout), the hub's this.
STREAM_SECONDS = 3600.0
AUTHORIZE_SECONDS = 60.0  # how often an open stream's caller is authorised again: API Gateway's cache of a key
AUTHORIZE_ENV = "AGENTQ_AUTHORIZER_CACHE_SECONDS"  # the deployment's api.authorizer_cache_seconds (infra/)


def authorize_seconds(environ: Mapping[str, str] | None = None) -> float:
    """How often a server's open streams are authorised again: the deployment's authorizer cache
    (``AGENTQ_AUTHORIZER_CACHE_SECONDS``, set by the stack), so a revoked key stops reaching a
    stream no later than it stops reaching the API (docs/DEPLOY.md)."""
    env = os.environ if environ is None else environ
    return float(env.get(AUTHORIZE_ENV) or AUTHORIZE_SECONDS)


def frames(events: list[dict[str, Any]]) -> str:
    """Events as a stream's frames, the first carrying ``retry:`` ("" for none)."""
    return RETRY + "".join(frame(e) for e in events) if events else ""


def frame(event: dict[str, Any]) -> str:
    """One server-sent event. An uncommitted one has no ``id:`` line, so a client's
    ``Last-Event-ID`` stays at the last committed event."""
    head = f"id: {event['id']}\n" if event.get("id") else ""
    return f"{head}event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


class EventHub:
    """The pollers of one process; a poller lives while it has subscribers (and ``linger``
    seconds after, so a client that reconnects finds it warm)."""

    def __init__(
        self,
        store: Storage,
        *,
        interval: float = 0.3,
        keepalive: float = 15.0,
        linger: float = 10.0,
        settle: float = SETTLE,
        idle_interval: float | None = None,
        caps: StreamCaps | None = None,
        max_seconds: float | None = STREAM_SECONDS,
        authorize_every: float = AUTHORIZE_SECONDS,
    ) -> None:
        """``idle_interval``: the pollers are fed (``api/stream_feed.py`` calls ``nudge``) and
        read on their own only that often; None: each reads every ``interval``. ``caps``: the
        streams a tenant (and a user) may hold open here (``api/stream_caps.py``).
        ``max_seconds``: a stream's longest life (None: the task's); ``authorize_every``: how
        often a stream asks its server whether its caller may still watch (``stream``)."""
        self.max_seconds = max_seconds
        self.authorize_every = max(authorize_every, 1.0)
        self.store = store
        self.settle = settle
        self.idle_interval = idle_interval
        self.caps = caps
        self.interval = interval
        self.keepalive = keepalive
        self.linger = linger
        self.lock = threading.Lock()
        self.pollers: dict[str, TaskPoller] = {}
        self.direct_reads = 0  # subscribers reading their own way up to a poller's buffer
        self.retired_reads = 0  # of pollers that have stopped

    def attach(self, task_id: str, wake: threading.Event, *, eager: bool = False) -> TaskPoller:
        with self.lock:
            poller = self.pollers.get(task_id)
            if poller is not None:
                with poller.lock:
                    if not poller.stopped.is_set():
                        poller.subscribers[wake] = None
                        poller.idle_since = None
                        poller.eager += eager
                        if eager:
                            poller.nudged.set()  # leave a long idle wait now
                        return poller
            poller = TaskPoller(self.store, task_id, self.interval, self.linger, self._stopped, self.idle_interval)
            poller.subscribers[wake] = None
            poller.eager += eager
            self.pollers[task_id] = poller.start()
            return poller

    def detach(self, poller: TaskPoller, wake: threading.Event, *, eager: bool = False) -> None:
        with poller.lock:
            poller.subscribers.pop(wake, None)
            poller.eager -= eager
            if not poller.subscribers:
                poller.idle_since = time.monotonic()

    def nudge(self, task_ids: set[str] | None, *, light: set[str] | frozenset[str] = frozenset()) -> int:
        """Have the pollers of ``task_ids`` (None: all) read now: the table's stream says they
        changed (or that changes may have been missed). ``light``: of those, the ones whose META
        alone changed, read eventually consistent. How many were nudged."""
        with self.lock:
            pollers = [p for t, p in self.pollers.items() if task_ids is None or t in task_ids]
        for poller in pollers:
            with poller.lock:
                if poller.task_id not in light:
                    poller.strong = True  # a light nudge never downgrades a pending strong one
            poller.nudged.set()
        return len(pollers)

    def _stopped(self, poller: TaskPoller) -> None:
        with self.lock:
            if self.pollers.get(poller.task_id) is poller:
                del self.pollers[poller.task_id]
                self.retired_reads += poller.reads

    @property
    def reads(self) -> int:
        """The table reads of this hub's pollers and of subscribers catching up."""
        with self.lock:
            return self.direct_reads + self.retired_reads + sum(p.reads for p in self.pollers.values())

    def open(self, caller: Caller, task_id: str, cursor: str | None, *, tree: bool, field: str) -> Watch:
        """The watch a stream serves, checked before any byte is sent: a task the caller may not
        see (another tenant's, another user's) or an unknown one is ``TaskNotFound``, a cursor
        not of this task (or tree) ``InvalidCursor``."""
        task = owned(self.store, task_id, caller)
        return Watch.open(self.store, task, cursor, tree=tree, field=field, settle=self.settle)

    def key_live(self, key_id: str) -> bool:
        """Whether API key ``key_id`` is still there and not revoked (one GetItem): how a stream
        behind API Gateway, which authorised it as it opened, is authorised again."""
        key = self.store.api_keys.get(key_id)
        return key is not None and not key.revoked

    def finished(self, watch: Watch) -> bool:
        """Whether a stream of ``watch`` would send nothing: every task has ended and no event
        follows its cursor (answered 204, which tells an EventSource not to reconnect)."""
        for watched in watch.tasks.values():
            head = self.store.events.head(watched.task_id)
            if head is None:
                continue
            if not head.status.terminal or self.store.events.read(watched.task_id, head, watched.cursor, limit=1):
                return False
        return True

    def stream(
        self,
        watch: Watch,
        *,
        allowed: Callable[[], bool] | None = None,
        wake: threading.Event | None = None,
        gone: Callable[[], bool] | None = None,
    ) -> Iterator[str]:
        """The frames of ``watch``'s stream until every task has ended (see the module), or
        until it has lived ``max_seconds``, or ``allowed`` (asked every ``authorize_every``
        seconds) says its caller may no longer watch: those two end it quietly, without
        ``END``, so a client resumes from its last id and is authorised again, or refused (401).
        ``gone``: whether the client hung up, which sets ``wake`` (``api/hang_ups.py``): the
        stream ends then, not at its next write (the next keep-alive, 15 s on).
        Why: a stream was authorised once, when it opened, and lived as long as its task (days
        on the hub): a key revoked, or a token expired, went on receiving every event; on the
        events function a stream outliving the Lambda's 900 s timeout was killed mid-frame, a
        timeout Lambda counts as an error (the ``EventStreamFailures`` alarm)."""
        wake = wake or threading.Event()
        attached: dict[str, TaskPoller] = {}
        eager: dict[str, bool] = {}  # of a tree's tasks: whether this watch holds events by its poller's reads
        retry = RETRY  # with the first event
        try:
            quiet_since = checked = opened = time.monotonic()
            ends = opened + self.max_seconds if self.max_seconds is not None else None
            while True:
                now = time.monotonic()
                if (ends is not None and now >= ends) or (gone is not None and gone()):
                    return
                if allowed is not None and now - checked >= self.authorize_every:
                    if not allowed():
                        return
                    checked = now
                for task_id in list(watch.tasks):
                    if task_id not in attached:
                        attached[task_id] = self.attach(task_id, wake, eager=watch.tree)
                        eager[task_id] = watch.tree
                out: list[str] = []
                behind = False
                if watch.tree:
                    heads: dict[str, Head] = {}
                    for task_id, watched in list(watch.tasks.items()):
                        more, head = self._fill(watch, watched, attached[task_id], wake)
                        behind = behind or more
                        if head is not None:
                            heads[task_id] = head
                    out = [frame(e) for e in watch.take(READ_PAGE)]
                    for task_id, head in heads.items():
                        delta = watch.delta(watch.tasks[task_id], head)
                        if delta is not None:
                            out.append(frame(delta))
                    self._hold(watch, attached, eager)
                else:
                    out, behind = self._next(watch, watch.tasks[watch.root], attached[watch.root], wake)
                if out:
                    chunk, out = retry + "".join(out), []  # held once while it is written, not twice
                    yield chunk
                    retry = chunk = ""
                    quiet_since = time.monotonic()
                if watch.done:
                    yield END
                    return
                if behind or set(watch.tasks) - set(attached):
                    continue
                wait = self.keepalive - (time.monotonic() - quiet_since)
                if wait <= 0:
                    yield ": keep-alive\n\n"
                    quiet_since = time.monotonic()
                    continue
                if allowed is not None:
                    wait = min(wait, checked + self.authorize_every - time.monotonic())
                if ends is not None:
                    wait = min(wait, ends - time.monotonic())
                held = any(w.pending for w in watch.tasks.values())  # until the other tasks are read past them
                wake.wait(
                    timeout=max(0.0, min(wait, self.interval) if held else wait)
                )  # a poller sets it on any change
                wake.clear()
        finally:
            for task_id, poller in attached.items():
                self.detach(poller, wake, eager=eager[task_id])

    @staticmethod
    def _hold(watch: Watch, attached: dict[str, TaskPoller], eager: dict[str, bool]) -> None:
        """Make a tree's poller read every ``interval`` (eager) only while its reads can release
        an event: while its task has not ended and another task of the tree has events still to
        send (``Watch.ready`` waits for the reads of the tasks not ended only). A sub-agent that
        ended and was read to its end, and a root left alone running, are read as any one-task
        watch's task: when the table's stream nudges them (``idle_interval`` on a fed hub).
        Eager, 20 ended sub-agents of a running root cost 200 strong reads in 3 s for nothing."""
        live = {t for t, w in watch.tasks.items() if not w.done}
        for task_id, poller in attached.items():
            watched = watch.tasks[task_id]
            want = not (watched.terminal and watched.read_at is not None) and bool(live - {task_id})
            if want != eager[task_id]:
                eager[task_id] = want
                with poller.lock:
                    poller.eager += 1 if want else -1
                if want:
                    poller.nudged.set()  # its reads are held for now: leave a long idle wait

    @staticmethod
    def _shared_frame(watch: Watch, watched: Watched, poller: TaskPoller, event: LogEvent) -> str:
        """The frame of a buffered event: made once per poller for every one-task watch (its id
        and text are the same for all of them), so a thousand subscribers encode it once. A tools
        step's frame names each call's input from the LLM step before it, which each watch holds
        for itself: one made by a watch without them (resumed past an LLM step it could not read)
        is sent to that watch alone, never shared, so no other watcher loses the inputs it has."""
        if watch.tree:
            return frame(watch.view(watched, event))
        with poller.lock:
            cached = poller.frames.get(event.position)
        if cached is None:
            body = event.step.body if event.step is not None else None
            whole = not isinstance(body, ToolsStep) or all(r.tool_use_id in watched.inputs for r in body.results)
            cached = frame(watch.view(watched, event))
            if whole:
                poller.share(event.position, cached)
        else:
            watched.cursor = event.position
            if watched.seen is None or event.position > watched.seen:
                watched.seen = event.position
            if event.step is not None:
                watched.live = None  # the step supersedes the live text sent before it
                if isinstance(event.step.body, LLMStep):  # the inputs a later tools step's frame names
                    watched.inputs = {u["id"]: u.get("input") or {} for u in event.step.body.tool_uses()}
        return cached

    def _next(
        self, watch: Watch, watched: Watched, poller: TaskPoller, wake: threading.Event
    ) -> tuple[list[str], bool]:
        """What to send of a one-task watch now, and whether more is ready at once (reading behind)."""
        snap = poller.snapshot(watched.seen, wake)
        if snap.head is None:
            if _stale(watch, snap):
                return [], False
            watched.gone, watched.read_at = True, snap.read_at
            return [], False
        if watched.seen is None or snap.base is None or watched.seen < snap.base:
            more = watch.read(watched, max_bytes=CATCH_UP_BYTES)
            self.direct_reads += 2
            return [frame(e) for e in watch.take(READ_PAGE)], more
        _prime(watch, watched, snap.head)
        out = [self._shared_frame(watch, watched, poller, e) for e in snap.events]
        self._caught_up(watched, snap, snap.head)
        delta = watch.delta(watched, snap.head)
        if delta is not None:
            out.append(frame(delta))
        return out, False

    def _fill(
        self, watch: Watch, watched: Watched, poller: TaskPoller, wake: threading.Event
    ) -> tuple[bool, Head | None]:
        """Take what the poller has of one task of a tree into its queue (or read it from the
        table when behind the poller's buffer); whether more is ready at once, and its META."""
        snap = poller.snapshot(watched.seen, wake)
        if snap.head is None:
            if _stale(watch, snap):
                return False, None
            watched.gone, watched.read_at = True, snap.read_at
            return False, None
        if watched.seen is None or snap.base is None or watched.seen < snap.base:
            if watched.pending:  # its last page is not all sent: a task holds one page at a time
                return False, None
            more = watch.read(watched, max_bytes=CATCH_UP_BYTES)
            self.direct_reads += 2
            return more, None
        _prime(watch, watched, snap.head)
        watched.pending.extend(snap.events)
        self._caught_up(watched, snap, snap.head)
        return False, snap.head

    @staticmethod
    def _caught_up(watched: Watched, snap: Snapshot, head: Head) -> None:
        """Everything of the task up to the poller's read (``head``) is sent or queued."""
        if snap.through is not None and (watched.seen is None or snap.through > watched.seen):
            watched.seen = snap.through
        watched.gone, watched.read_at, watched.terminal = False, snap.read_at, head.status.terminal


def _prime(watch: Watch, watched: Watched, head: Head) -> None:
    """Load the tool inputs of the LLM step a resumed watch's cursor is at, which its next tools
    step's frame names: once the poller has read that far. A cursor ahead of the poller's read
    (a client back from another server, whose reads were fresher) waits for the read that
    reaches it; primed before, it would find no step and the tools step would name no inputs."""
    if watched.cursor is None or watched.cursor.step <= head.step:
        watch.prime_inputs(watched, head)


def _stale(watch: Watch, snap: Snapshot) -> bool:
    """Whether the poller's "no such task" was read before the watch was opened. A poller is
    shared: one a tree's stream started for a sub-agent not yet written (its ``task.spawned``
    can commit first) still says "no such task" until its next read, when a stream of that
    sub-agent alone, opened once it exists, attaches to it. Believed, that read would end the
    new stream at once with nothing sent; the stream waits for the poller's next read instead
    (the poller wakes every subscriber after each read)."""
    return snap.read_at is None or snap.read_at < watch.opened
