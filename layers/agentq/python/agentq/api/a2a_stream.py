"""The events of an A2A stream (``SendStreamingMessage``, ``SubscribeToTask``; ``api/a2a_server.py``):
the task as it is, then a status update at each change of its A2A state, the task's artifacts
(``queueing/a2a_artifacts.py``: the result, and its workspace's files) as artifact updates before
the completed one. A change is what a read of the task finds changed since the stream's last
read, so a state the task holds only between two reads (``submitted`` from an answer to the next
claim) can reach one subscriber and not another; each stream's states are in the order the task
took them, and every stream ends with the same artifacts and final state.

Two ways to serve one, by what holds the connection (``api/live_stream.py``):

- **Live** (the local server, the streaming function in AWS): each change is sent when the
  events hub's poller of the task reads it (``GET /tasks/{id}/events``' own path: one table read
  per change, however many streams watch the task), for up to ``LIVE_SECONDS``, and authorised
  again as that stream is, every ``hub.authorize_every`` seconds (``LiveStream.allowed``): a
  revoked key's or an expired token's stream ends quietly, and its resume is refused. A subscription
  follows the task to its end, through ``input-required`` while another request answers it (the
  protocol's ``SubscribeToTask`` closes only at a terminal state); a streamed send ends where a
  blocking send answers, when the task waits for someone or ends.
- **Whole** (the API Lambda answers once): the task is polled and the stream sent when it
  stops (waits for someone or ends) or after ``STREAM_SECONDS`` (API Gateway answers within
  29 s). ``SubscribeToTask`` resumes either: it starts with the task as it is now, so nothing
  committed is lost between two streams.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from agentq.api.live_stream import LIVE_SECONDS, TaskWatch, live_var
from agentq.core.models import Task, TaskStatus

STREAM_SECONDS = 25.0  # a whole stream's window: API Gateway answers within 29 s
POLL_SECONDS = 0.25  # a whole stream's poll
WAKE_SECONDS = 5.0  # a live stream's wait for the poller's wake-up: a safety net, not the pace


def stopped(task: Task, heard: int) -> bool:
    """Whether the task waits for someone (input, auth) or has ended, with the first ``heard``
    messages delivered: nothing more happens without a caller."""
    if task.status.terminal and task.status is not TaskStatus.SUCCEEDED:
        return True
    if task.status is TaskStatus.PAUSED:
        return True
    return (task.status.terminal or task.status is TaskStatus.IDLE) and task.messages_delivered >= heard


def _still_allowed(allowed: Callable[[], bool]) -> bool:
    """``allowed``'s answer; a check that fails (the table unreachable) ends the stream too: the
    client comes back through the door, which authorises it again."""
    try:
        return allowed()
    except Exception:
        return False


def ended(task: Task, heard: int) -> bool:
    """Whether the task has ended for good (a subscription's end), its first ``heard`` messages
    delivered."""
    return task.status.terminal and stopped(task, heard)


async def task_events(
    view: Callable[[Task], Any],
    poll: Callable[[str, int], tuple[Task, Any | None]],
    off_loop: Callable[[Callable[[], Any]], Any],
    task: Task,
    heard: int,
    *,
    follow: bool,
) -> AsyncGenerator[Any]:
    """The events of ``task``'s stream. ``view``: a task's A2A view; ``poll``: the task now and
    its view (None while it is idle before taking ``heard`` messages in); ``off_loop``: runs a
    store call on a thread. ``follow``: on a live stream, go on through ``input-required`` to
    the end (a subscription), else stop where the task waits for someone."""
    from a2a.types import TaskArtifactUpdateEvent, TaskStatusUpdateEvent

    live = live_var.get()
    watch = TaskWatch(live.hub, task.task_id) if live is not None else None  # attached before the first read
    try:
        done = ended if watch is not None and follow else stopped
        now = await off_loop(lambda: view(task))
        yield now
        last = (now.status.state, now.status.message.message_id)
        deadline = time.monotonic() + (LIVE_SECONDS if watch is not None else STREAM_SECONDS)
        task_id = task.task_id
        checked = time.monotonic()
        while not done(task, heard) and time.monotonic() < deadline:
            if watch is not None:
                assert live is not None
                every = live.hub.authorize_every
                if live.allowed is not None and time.monotonic() - checked >= every:
                    if not await asyncio.to_thread(_still_allowed, live.allowed):
                        return  # quietly, as an events stream ends: the client's resume is authorised again
                    checked = time.monotonic()
                wait = WAKE_SECONDS if live.allowed is None else min(WAKE_SECONDS, checked + every - time.monotonic())
                await asyncio.to_thread(watch.wait, max(0.0, wait))
            else:
                await asyncio.sleep(POLL_SECONDS)
            task, now = await off_loop(lambda: poll(task_id, heard))
            if now is None:
                continue  # idle with a message not yet taken in: about to run again
            state = (now.status.state, now.status.message.message_id)
            if state == last:
                continue
            last = state
            for artifact in now.artifacts:
                yield TaskArtifactUpdateEvent(task_id=now.id, context_id=now.context_id, artifact=artifact,
                                              last_chunk=True)  # fmt: skip
            yield TaskStatusUpdateEvent(task_id=now.id, context_id=now.context_id, status=now.status,
                                        metadata=now.metadata)  # fmt: skip
    finally:
        if watch is not None:
            watch.close()
