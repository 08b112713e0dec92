"""Events for whoever subscribes: always a structured log line on ``agentq.events``, and an
EventBridge event when ``AGENTQ_EVENT_BUS`` names a bus (the stack creates ``{prefix}-events``).

Status changes (``TaskStatusChanged``) are sent as they are written (to a bus only), best effort: a bus that
cannot be reached is logged, never raised, so a task never fails for its notification. The
events client is made once per process (boto3 clients are not cheap to make)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

events_log = logging.getLogger("agentq.events")
_client: Any = None
_lock = threading.Lock()


def _events_client() -> Any:
    global _client
    with _lock:
        if _client is None:
            import boto3

            _client = boto3.client("events")
        return _client


def emit_event(detail_type: str, detail: dict[str, object], *, level: int = logging.WARNING) -> None:
    events_log.log(level, json.dumps({"event": detail_type, **detail}, default=str))
    bus = os.environ.get("AGENTQ_EVENT_BUS")
    if not bus:
        return
    entry = {"Source": "agentq", "DetailType": detail_type, "Detail": json.dumps(detail, default=str),
             "EventBusName": bus}  # fmt: skip
    try:
        failed = _events_client().put_events(Entries=[entry]).get("FailedEntryCount", 0)
        if failed:
            events_log.warning("EventBridge refused a %s event for bus %s", detail_type, bus)
    except Exception:  # the bus is a notification, not a dependency of the task
        events_log.warning("could not send a %s event to bus %s", detail_type, bus, exc_info=True)


def task_status_changed(task_id: str, tenant: str, status: str, **detail: object) -> None:
    """A task moved to ``status`` (``TaskStatusChanged``: task id, tenant, status, time, and
    what the writer knows besides: the error code, the claim's epoch). Without a bus nothing
    is written: the task's own trace and log lines already say it."""
    if not os.environ.get("AGENTQ_EVENT_BUS"):
        return
    emit_event(
        "TaskStatusChanged",
        {"task_id": task_id, "tenant": tenant, "status": status, "at": round(time.time(), 3), **detail},
        level=logging.DEBUG,  # one a transition: the bus carries them; the trace shows them already
    )


def message_received(task_id: str, tenant: str, seq: int, *, reopened: bool) -> None:
    """A task took a person's message (``MessageReceived``: its place among the task's messages,
    and whether it reopened an answered or interrupted task). To a bus only, like a status change."""
    if not os.environ.get("AGENTQ_EVENT_BUS"):
        return
    emit_event(
        "MessageReceived",
        {"task_id": task_id, "tenant": tenant, "seq": seq, "reopened": reopened, "at": round(time.time(), 3)},
        level=logging.DEBUG,
    )
