"""A connection that can take an answer piece by piece, handed to a route by the server that
holds it: the local API server (``agentq dev``, the tests) and, in AWS, the streaming function
behind the Lambda Web Adapter (``functions/events/server.py``) both run the API's handler in the
request's thread, and a route that streams (``POST /a2a/{agent}``'s ``SendStreamingMessage`` and
``SubscribeToTask``) writes each event to the socket as it happens instead of returning one body.

Why a context variable and not a second route: the route's checks (the caller, the agent, the
request's headers, the protocol's errors) run exactly as in the API Lambda, which has no such
connection and answers a stream whole; only the last step, sending, differs. The server sets
``live_var`` for the request, the route reads it; a route that never starts a stream leaves
``started`` False and the server replies with the handler's answer as usual.

The server's ``EventHub`` rides along: a live stream learns of a task's changes from the same
pollers ``GET /tasks/{id}/events`` uses (``wait_for_change``), not from a poll of its own.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentq.api.event_hub import EventHub
    from agentq.api.task_poller import TaskPoller

LIVE_SECONDS = 840.0  # one live stream's longest life: under the streaming integration's 15 minutes in AWS


class ClientGone(Exception):
    """The client hung up mid-stream: nothing more can be sent."""


@dataclass
class LiveStream:
    hub: EventHub
    start: Callable[[int, dict[str, str]], None]  # the status and headers, once, before any chunk
    send: Callable[[bytes], None]  # one chunk, flushed; raises OSError when the client went away
    # Whether the request's caller may still watch (``http_server``'s ``_allowed``, asked every
    # ``hub.authorize_every`` seconds as ``EventHub.stream`` asks it): a revoked key's stream
    # ends then; None: nothing to ask again (no authorizer, the one local user).
    allowed: Callable[[], bool] | None = None
    started: bool = field(default=False)

    def begin(self, status: int, headers: dict[str, str]) -> None:
        self.started = True
        try:
            self.start(status, headers)
        except OSError as exc:
            raise ClientGone(str(exc)) from exc

    def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        try:
            self.send(chunk)
        except OSError as exc:
            raise ClientGone(str(exc)) from exc


live_var: contextvars.ContextVar[LiveStream | None] = contextvars.ContextVar("agentq_live_stream", default=None)


class TaskWatch:
    """A wake-up each time the hub's poller of one task has read a change of it (or at
    ``timeout``): a live stream's way of waiting for the task, shared with every other stream of
    it in this process (one table read per change, whatever the number of streams)."""

    def __init__(self, hub: EventHub, task_id: str) -> None:
        self.hub = hub
        self.wake = threading.Event()
        self.poller: TaskPoller = hub.attach(task_id, self.wake)

    def wait(self, timeout: float) -> bool:
        woke = self.wake.wait(timeout)
        self.wake.clear()
        return woke

    def close(self) -> None:
        self.hub.detach(self.poller, self.wake)
