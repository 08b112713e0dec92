"""Observability, the core's one seam to it: metrics (CloudWatch EMF), traces (X-Ray through
the powertools Tracer), correlated logs and events. The engine and the adapters import this
package only; each part is a no-op where its output would go nowhere.

- ``names``: metric namespace, dimensions and names, shared with the dashboard (infra);
- ``emf``: what is counted, and when it is written;
- ``calls``: a subsegment and the metrics of each LLM call and each tool call;
- ``correlation``: task id, step, lease epoch and worker on every log line of a task;
- ``logs``: the core's loggers as powertools JSON (Lambda, ``agentq worker``) or text;
- ``events``: structured events (log line, EventBridge);
- ``grades``: a grade of an answer against its outcome, to all three (metric, event, trace);
- ``otel``: OpenTelemetry traces by OTLP/HTTP where ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set;
  ``otel_metrics`` the GenAI client metrics beside them; ``otlp`` the switch and service they share.

The names below are re-exported lazily (PEP 562), as ``agentq`` does its own: importing one
part (the authorizer wants ``route_core_logs`` only) does not load the others, so powertools'
Metrics and Tracer are not built where nothing records metrics or traces. The submodules are
reachable as attributes too (``observe.emf``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "InputCount": "calls",
    "LLMCall": "calls",
    "ToolCall": "calls",
    "input_count": "calls",
    "llm_call": "calls",
    "tool_call": "calls",
    "CorrelationFilter": "correlation",
    "bind": "correlation",
    "task_context": "correlation",
    "api_metrics": "emf",
    "enabled": "emf",
    "flush": "emf",
    "metrics": "emf",
    "record_budget_refusal": "emf",
    "record_policy_decision": "emf",
    "record_grade": "emf",
    "graded": "grades",
    "record_unknown_usage": "emf",
    "record_dead_letter": "emf",
    "record_swept": "emf",
    "record_run": "emf",
    "record_submitted": "emf",
    "tenant_soft_cap_crossed": "emf",
    "scope_cap_crossed": "emf",
    "tenant_held_at_limit": "emf",
    "circuit_changed": "emf",
    "emit_event": "events",
    "task_status_changed": "events",
    "message_received": "events",
    "configure_process_logging": "logs",
    "route_core_logs": "logs",
}
_SUBMODULES = frozenset(
    {"calls", "correlation", "emf", "events", "grades", "logs", "names", "otel", "otel_metrics", "otlp", "tracing"}
)

# Literal, so type checkers and linters see the public names; a test keeps it equal to _EXPORTS.
__all__ = [
    "CorrelationFilter",
    "InputCount",
    "LLMCall",
    "ToolCall",
    "api_metrics",
    "bind",
    "circuit_changed",
    "configure_process_logging",
    "emit_event",
    "enabled",
    "flush",
    "graded",
    "input_count",
    "llm_call",
    "message_received",
    "metrics",
    "record_budget_refusal",
    "record_dead_letter",
    "record_grade",
    "record_policy_decision",
    "record_run",
    "record_submitted",
    "record_swept",
    "record_unknown_usage",
    "route_core_logs",
    "scope_cap_crossed",
    "task_context",
    "task_status_changed",
    "tenant_held_at_limit",
    "tenant_soft_cap_crossed",
    "tool_call",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")  # the import sets the attribute
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next access skips this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)


if TYPE_CHECKING:
    # The submodules too (`observe.emf`): the redundant aliases mark them re-exported.
    from agentq.observe import calls as calls
    from agentq.observe import correlation as correlation
    from agentq.observe import emf as emf
    from agentq.observe import events as events
    from agentq.observe import grades as grades
    from agentq.observe import logs as logs
    from agentq.observe import names as names
    from agentq.observe import otel as otel
    from agentq.observe import otel_metrics as otel_metrics
    from agentq.observe import otlp as otlp
    from agentq.observe import tracing as tracing
    from agentq.observe.calls import InputCount, LLMCall, ToolCall, input_count, llm_call, tool_call
    from agentq.observe.correlation import CorrelationFilter, bind, task_context
    from agentq.observe.emf import (
        api_metrics,
        circuit_changed,
        enabled,
        flush,
        metrics,
        record_budget_refusal,
        record_dead_letter,
        record_grade,
        record_policy_decision,
        record_run,
        record_submitted,
        record_swept,
        record_unknown_usage,
        scope_cap_crossed,
        tenant_held_at_limit,
        tenant_soft_cap_crossed,
    )
    from agentq.observe.events import emit_event, message_received, task_status_changed
    from agentq.observe.grades import graded
    from agentq.observe.logs import configure_process_logging, route_core_logs
