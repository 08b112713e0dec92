"""Metrics (CloudWatch EMF through powertools) for what an operator watches: outcomes, steps,
pickup and resume latency, tokens per model, tool errors, budget refusals, submissions.

Two shapes, because an EMF document carries one value per dimension:

- ``metrics``: the shared set of ``{service}``-only counters (outcomes, steps, latency, DLQ
  moves). In Lambda the handler flushes it after each invocation (``metrics.log_metrics``);
  the long-running worker calls ``flush()`` on a timer.
- metrics with a dimension of their own (``model``, ``tool``, ``budget``, a pickup's ``tier``) are written at once,
  one document per event, from a powertools ``EphemeralMetrics`` that no other thread sees.

Recorded only where they go somewhere: Lambda, or a worker with ``AGENTQ_EMF=1`` (on Fargate
the awslogs driver ships stdout). Elsewhere nothing is kept, so local runs stay quiet.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from agentq.observe import names, otel_metrics
from agentq.observe.events import emit_event

if TYPE_CHECKING:
    from agentq.core.engine.result import RunResult
    from agentq.core.models import Usage

metrics = Metrics(namespace=names.NAMESPACE, service=names.EXECUTOR)
# The API Lambda's own set (``@api_metrics.log_metrics``): ``Metrics`` instances share one
# metric set per process, so a second ``Metrics`` would flush the executor's under "api".
api_metrics = EphemeralMetrics(namespace=names.NAMESPACE, service=names.API)

# powertools' metric sets are plain dicts, and print() writes a document and its newline in
# two calls: every add and every write goes through this lock.
_lock = threading.Lock()

MAX_MODELS = names.MAX_MODELS  # distinct model dimension values per process; beyond, "other"
_models: set[str] = set()


def enabled() -> bool:
    """Lambda (flushed per invocation) or a worker with AGENTQ_EMF=1; and not switched off
    with powertools' POWERTOOLS_METRICS_DISABLED."""
    wanted = os.environ.get("AGENTQ_EMF") == "1" or bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))
    return wanted and not is_metrics_disabled()


def record_run(run: RunResult) -> None:
    if not enabled():
        return
    with _lock:
        metrics.add_metric(name=names.run_outcome(run.outcome), unit=MetricUnit.Count, value=1)
        if run.steps_committed:
            metrics.add_metric(name=names.STEPS_COMMITTED, unit=MetricUnit.Count, value=run.steps_committed)
        if run.status is not None and run.status.terminal:
            metrics.add_metric(name=names.task_outcome(run.status.value), unit=MetricUnit.Count, value=1)
        task = run.claimed
        if task is None or not task.claim_count:
            return
        pickup = None
        if task.lease_epoch == 1 and task.pickup_latency is not None:
            pickup = round(task.pickup_latency, 3)
            metrics.add_metric(name=names.PICKUP_LATENCY, unit=MetricUnit.Seconds, value=pickup)
        elif task.last_resume_gap is not None:
            metrics.add_metric(name=names.RESUME_LATENCY, unit=MetricUnit.Seconds, value=round(task.last_resume_gap, 3))
    if pickup is not None:
        # Each tier has its own pickup objective (the stack alarms each at its own): the same
        # value again under the task's tier, a validated priority, so three series at most.
        _write_now({names.PICKUP_LATENCY: pickup}, MetricUnit.Seconds, {names.TIER: task.submission.priority})


def record_dead_letter() -> None:
    if not enabled():
        return
    with _lock:
        metrics.add_metric(name=names.DLQ_MOVES, unit=MetricUnit.Count, value=1)


def record_swept(count: int) -> None:
    """Tasks the sweeper found stranded (lease lapsed long ago, nothing since) and re-enqueued:
    each is a message lost or dead-lettered while its task could still run; 0 in a healthy fleet."""
    if not enabled():
        return
    _write_now({names.TASKS_SWEPT: count}, MetricUnit.Count, {})


def record_submitted() -> None:
    """A task was created on request (POST /tasks, a fork); replays of an idempotent submit
    are not counted."""
    if not enabled():
        return
    with _lock:
        api_metrics.add_metric(name=names.TASKS_SUBMITTED, unit=MetricUnit.Count, value=1)


def record_llm_usage(model: str, usage: Usage) -> None:
    """The tokens of one LLM call, under the model that answered; recorded when the response
    arrives, because the tokens are spent whether or not the step then commits."""
    if not enabled():
        return
    values = {
        names.TOKENS_IN: usage.input_total,
        names.TOKENS_OUT: usage.output_tokens,
        names.CACHE_READ_TOKENS: usage.cache_read_input_tokens,
        names.CACHE_WRITE_TOKENS: usage.cache_creation_input_tokens,
    }
    sent = {k: v for k, v in values.items() if v or k in (names.TOKENS_IN, names.TOKENS_OUT)}
    _write_now(sent, MetricUnit.Count, {names.MODEL: _model_dimension(model)})


def record_tool_error(tool: str) -> None:
    """``tool`` must be a registered tool's name or ``names.UNREGISTERED_TOOL``: the registry
    is deploy-time code, so the series stay as few as the tools."""
    if not enabled():
        return
    _write_now({names.TOOL_ERRORS: 1}, MetricUnit.Count, {names.TOOL: tool})


def record_budget_refusal(budget: names.Budget) -> None:
    """A reservation refused: the task tree's budget is spent (the task ends cost_exceeded or
    a spawn is refused), or the tenant's hourly window or a scope's cap is full (the task waits)."""
    if not enabled():
        return
    _write_now({names.BUDGET_REFUSALS: 1}, MetricUnit.Count, {names.BUDGET: budget})


def record_grade(result: Literal["passed", "below_bar", "error"]) -> None:
    """An answer graded against its task's outcome (``core.engine._grade``)."""
    if not enabled():
        return
    _write_now({names.GRADES: 1}, MetricUnit.Count, {names.GRADE: result})


def record_policy_decision(effect: str, shadow: list[str]) -> None:
    """A call a policy rule took part in: what was decided, and each log_only rule's would-be
    decision (``would_deny``/``would_ask``), counted beside it."""
    if not enabled():
        return
    _write_now({names.POLICY_DECISIONS: 1}, MetricUnit.Count, {names.DECISION: effect})
    for would in shadow:
        _write_now({names.POLICY_DECISIONS: 1}, MetricUnit.Count, {names.DECISION: f"would_{would}"})


def record_unknown_usage(tenant: str, task_id: str, tokens: int, micros: int) -> None:
    """A hold counted as spent with its call's outcome unknown (ARCHITECTURE 4): ``tokens`` and
    ``micros`` of it not known to be billed. A metric (no tenant dimension: bounded series), an
    event naming the tenant and the task for whoever bills (always a structured log line), and
    the OpenTelemetry counter."""
    if tokens <= 0 and micros <= 0:
        return
    if enabled():
        _write_now({names.UNKNOWN_TOKENS: tokens}, MetricUnit.Count, {})
    emit_event("UnknownUsageCounted", {"tenant": tenant, "task_id": task_id, "tokens": tokens, "usd_micros": micros})
    otel_metrics.record_unknown(tenant, tokens)


def tenant_soft_cap_crossed(tenant: str, held: int, cap: int) -> None:
    """A metric for the alarm and an event for whoever subscribes (EventBridge when
    AGENTQ_EVENT_BUS is set; always a structured log line)."""
    if enabled():
        with _lock:
            metrics.add_metric(name=names.TENANT_SOFT_CAP_CROSSED, unit=MetricUnit.Count, value=1)
    emit_event("TenantSoftCapCrossed", {"tenant": tenant, "tokens_this_hour": held, "hourly_cap": cap})


def scope_cap_crossed(tenant: str, scope: str, name: str, window: str, metric: str, value: int, cap: int) -> None:
    """A scope's window crossed 80 % of its cap (``storage.scope_caps``, once a window): a metric
    by scope kind the stack alarms on (three series, whatever the users) and an event naming the
    tenant, scope, window and amounts (EventBridge when AGENTQ_EVENT_BUS is set; always a log line)."""
    if enabled():
        _write_now({names.SCOPE_CAP_CROSSED: 1}, MetricUnit.Count, {names.SCOPE: scope})
    emit_event("ScopeCapCrossed", {"tenant": tenant, "scope": scope, "name": name, "window": window,
                                   "metric": metric, "value": value, "cap": cap})  # fmt: skip


def tenant_held_at_limit(tenant: str, held_by: Literal["tenant", "key", "tier"], limit: int) -> None:
    """A task parked at its tenant's running limit (or its concurrency key's, or its tenant's
    limit in its tier): a metric the stack alarms on (its series stay three, whatever the tenants) and an event naming the tenant
    (EventBridge when AGENTQ_EVENT_BUS is set; always a structured log line)."""
    if enabled():
        _write_now({names.TASKS_HELD_AT_LIMIT: 1}, MetricUnit.Count, {names.HELD_BY: held_by})
        _write_now({names.TASKS_HELD_AT_LIMIT: 1}, MetricUnit.Count, {})  # the fleet-wide count the alarm watches
    emit_event("TenantHeldAtLimit", {"tenant": tenant, "held_by": held_by, "limit": limit})


def circuit_changed(circuit: str, state: str, detail: dict[str, Any]) -> None:
    """A shared circuit breaker opened or closed (``storage.flow``): a metric the stack alarms
    on, and an event (EventBridge when AGENTQ_EVENT_BUS is set; always a log line)."""
    if enabled():
        name = names.CIRCUIT_OPENED if state == "open" else names.CIRCUIT_CLOSED
        _write_now({name: 1}, MetricUnit.Count, {names.CIRCUIT: circuit[:200]})
        _write_now({name: 1}, MetricUnit.Count, {})  # the fleet-wide count the alarm watches
    emit_event("CircuitOpened" if state == "open" else "CircuitClosed", {"circuit": circuit, **detail})


def flush() -> None:
    """The worker's timer: write what the shared sets hold (with AGENTQ_EMF=1), else drop it."""
    with _lock:
        for sink in (metrics, api_metrics):
            if sink.metric_set and os.environ.get("AGENTQ_EMF") == "1" and not is_metrics_disabled():
                _write(sink)
            sink.clear_metrics()


def _model_dimension(model: str) -> str:
    """Models are what providers answered as, so they are few; the scripted provider echoes
    any name it is given, so a process keeps at most MAX_MODELS of them."""
    with _lock:
        if model in _models:
            return model
        if len(_models) < MAX_MODELS:
            _models.add(model)
            return model
    return names.OTHER_MODEL


def _write_now(values: Mapping[str, float], unit: MetricUnit, dimensions: dict[str, str]) -> None:
    sink = EphemeralMetrics(namespace=names.NAMESPACE, service=names.EXECUTOR)
    for key, value in dimensions.items():
        sink.add_dimension(name=key, value=value)
    for name, amount in values.items():
        sink.add_metric(name=name, unit=unit, value=amount)
    with _lock:
        _write(sink)


def _write(sink: Metrics | EphemeralMetrics) -> None:
    """One EMF document as one write (callers hold the lock)."""
    sys.stdout.write(json.dumps(sink.serialize_metric_set(), separators=(",", ":")) + "\n")
    sys.stdout.flush()
