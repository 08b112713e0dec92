"""Metrics (CloudWatch EMF through powertools) for what an operator watches: outcomes, steps,
pickup and resume latency.

In Lambda the handler flushes after each invocation (``metrics.log_metrics``). The
long-running worker calls ``flush()`` on a timer; it prints EMF lines to stdout only when
``AGENTQ_EMF=1`` (on Fargate the awslogs driver ships them), and otherwise discards them so
local runs stay quiet.
"""

from __future__ import annotations

import os
import threading

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from agentq.engine import RunResult

metrics = Metrics(namespace="agentq", service="executor")
_lock = threading.Lock()  # powertools' metric set is a plain dict shared by all threads


def record_run(run: RunResult) -> None:
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
    with _lock:
        metrics.add_metric(name="dlq_moves", unit=MetricUnit.Count, value=1)


def flush() -> None:
    with _lock:
        if os.environ.get("AGENTQ_EMF") == "1":
            metrics.flush_metrics()
        else:
            metrics.clear_metrics()
