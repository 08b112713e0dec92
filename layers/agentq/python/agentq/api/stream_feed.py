"""The events hub's doorbell: the table's stream nudges the pollers of the tasks that changed.

Why: a poller per watched task reading META every 300 ms (``api/event_hub.py``'s default) costs
about 12,000 strongly consistent reads per task-hour whether the task moves or not; behind the
stream a poller reads only when its task was written (a commit, an event, a heartbeat carrying
live text) and otherwise once every ``EventHub.idle_interval`` as a safety net. What it reads is
what it read before (META, then the log after its position), so ordering, resumption and the
frames are the event hub's, unchanged; the stream only says when.

A pass that may have missed records (an iterator expired or trimmed, a failed read) nudges every
poller: they read and find whatever happened. While the stream cannot be read at all, the
pollers fall back to their idle reads, and ``healthy`` turns false so the load balancer's health
check (``/health`` of the hub) can take the server out.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from agentq.api.event_hub import EventHub
from agentq.storage.table_stream import TableStream

log = logging.getLogger("agentq.hub")

STALE_SECONDS = 30.0  # no successful pass for this long: unhealthy


class StreamFeed:
    def __init__(self, hub: EventHub, stream: TableStream, *, interval: float = 0.4) -> None:
        """``interval``: the pause between passes, a GetRecords per shard each. DynamoDB Streams
        throttles more than two readers of a shard: the reaper's event source mapping is one
        (Lambda polls a shard about four times a second), a hub server the other, so the stack
        runs one (``infra/live_settings.py``); 0.4 s keeps a nudge under half a second."""
        self.hub = hub
        self.stream = stream
        self.interval = interval
        self.stopped = threading.Event()
        self.passes = 0
        self.records = 0
        self.calls = 0  # GetRecords and DescribeStream calls (bench/live_cost.py prices them)
        self.nudges = 0
        self.last_pass: float | None = None
        self.thread = threading.Thread(target=self._run, name="events-stream-feed", daemon=True)

    def start(self) -> StreamFeed:
        self.stream.start()
        self.last_pass = time.monotonic()
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)

    @property
    def healthy(self) -> bool:
        return self.last_pass is not None and time.monotonic() - self.last_pass < STALE_SECONDS

    def status(self) -> dict[str, Any]:
        return {"stream": "ok" if self.healthy else "stale", "passes": self.passes, "records": self.records}

    def once(self) -> None:
        """One pass: read the stream, nudge the pollers of what changed."""
        try:
            changes = self.stream.changed()
        except Exception:
            log.exception("reading the table's stream failed: every poller reads once, then its idle reads")
            self.nudges += self.hub.nudge(None)
            raise
        self.passes += 1
        self.records += changes.records
        self.calls += changes.calls
        self.last_pass = time.monotonic()
        if changes.lost:
            self.nudges += self.hub.nudge(None)
        elif changes.tasks:
            # META alone written (the heartbeat's live text): an eventually consistent read is
            # enough, the next strong one supersedes it; a step, an event or a claim also wrote
            # an item of its own, and those are read strongly (api/event_hub.py).
            self.nudges += self.hub.nudge(changes.tasks, light=changes.metas - changes.logged)

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.once()
            except Exception:
                self.stopped.wait(min(5.0, self.interval * 8))
                continue
            self.stopped.wait(self.interval)
