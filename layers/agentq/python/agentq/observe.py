"""Metrics (CloudWatch EMF through powertools) for what an operator watches: outcomes, steps,
pickup and resume latency.

In Lambda the handler flushes after each invocation (``metrics.log_metrics``). The
long-running worker calls ``flush()`` on a timer; it prints EMF lines to stdout only when
``AGENTQ_EMF=1`` (on Fargate the awslogs driver ships them), and otherwise discards them so
local runs stay quiet.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentq.engine import RunResult

metrics = Metrics(namespace="agentq", service="executor")
_lock = threading.Lock()
events_log = logging.getLogger("agentq.events")  # powertools' metric set is a plain dict shared by all threads


def _enabled() -> bool:
    """Record only where the metrics go somewhere: Lambda (flushed per invocation) or a worker
    with AGENTQ_EMF=1. Otherwise powertools would print EMF to stdout every 100 values."""
    return bool(os.environ.get("AGENTQ_EMF") == "1" or os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))


def record_run(run: RunResult) -> None:
    if not _enabled():
        return
    with _lock:
        metrics.add_metric(name=f"runs_{run.outcome}", unit=MetricUnit.Count, value=1)
        if run.steps_committed:
            metrics.add_metric(name="steps_committed", unit=MetricUnit.Count, value=run.steps_committed)
        if run.status is not None and run.status.terminal:
            metrics.add_metric(name=f"tasks_{run.status.value}", unit=MetricUnit.Count, value=1)
        task = run.claimed
        if task is None or not task.claims:
            return
        if task.lease_epoch == 1 and task.pickup_latency is not None:
            metrics.add_metric(name="pickup_latency", unit=MetricUnit.Seconds, value=round(task.pickup_latency, 3))
        elif task.last_resume_gap is not None:
            metrics.add_metric(name="resume_latency", unit=MetricUnit.Seconds, value=round(task.last_resume_gap, 3))


def record_dead_letter() -> None:
    if not _enabled():
        return
    with _lock:
        metrics.add_metric(name="dlq_moves", unit=MetricUnit.Count, value=1)


def record_tenant_refusal(tenant: str) -> None:
    if not _enabled():
        return
    with _lock:
        metrics.add_metric(name="budget_refusals", unit=MetricUnit.Count, value=1)


def tenant_soft_cap_crossed(tenant: str, held: int, cap: int) -> None:
    """A metric for the alarm and an event for whoever subscribes (EventBridge when
    AGENTQ_EVENT_BUS is set; always a structured log line)."""
    if _enabled():
        with _lock:
            metrics.add_metric(name="tenant_soft_cap_crossed", unit=MetricUnit.Count, value=1)
    emit_event("TenantSoftCapCrossed", {"tenant": tenant, "tokens_this_hour": held, "hourly_cap": cap})


def emit_event(detail_type: str, detail: dict[str, object]) -> None:
    events_log.warning(json.dumps({"event": detail_type, **detail}))
    bus = os.environ.get("AGENTQ_EVENT_BUS")
    if bus:
        import boto3

        boto3.client("events").put_events(
            Entries=[{"Source": "agentq", "DetailType": detail_type, "Detail": json.dumps(detail), "EventBusName": bus}]
        )


def flush() -> None:
    with _lock:
        if os.environ.get("AGENTQ_EMF") == "1":
            metrics.flush_metrics()
        else:
            metrics.clear_metrics()
