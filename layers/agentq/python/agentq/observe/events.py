"""Events for whoever subscribes: always a structured log line on ``agentq.events``, and an
EventBridge event when ``AGENTQ_EVENT_BUS`` names a bus."""

from __future__ import annotations

import json
import logging
import os

events_log = logging.getLogger("agentq.events")


def emit_event(detail_type: str, detail: dict[str, object]) -> None:
    events_log.warning(json.dumps({"event": detail_type, **detail}))
    bus = os.environ.get("AGENTQ_EVENT_BUS")
    if bus:
        import boto3

        boto3.client("events").put_events(
            Entries=[{"Source": "agentq", "DetailType": detail_type, "Detail": json.dumps(detail), "EventBusName": bus}]
        )
