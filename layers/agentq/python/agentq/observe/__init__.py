"""Observability, the core's one seam to it: metrics (CloudWatch EMF), traces (X-Ray through
the powertools Tracer), correlated logs and events. The engine and the adapters import this
package only; each part is a no-op where its output would go nowhere.

- ``names``: metric namespace, dimensions and names, shared with the dashboard (infra);
- ``emf``: what is counted, and when it is written;
- ``calls``: a subsegment and the metrics of each LLM call and each tool call;
- ``correlation``: task id, step, lease epoch and worker on every log line of a task;
- ``logs``: the core's loggers as powertools JSON (Lambda, ``agentq worker``) or text;
- ``events``: structured events (log line, EventBridge).
"""

from agentq.observe.calls import LLMCall, ToolCall, llm_call, tool_call
from agentq.observe.correlation import CorrelationFilter, bind, task_context
from agentq.observe.emf import (
    api_metrics,
    enabled,
    flush,
    metrics,
    record_budget_refusal,
    record_dead_letter,
    record_run,
    record_submitted,
    tenant_soft_cap_crossed,
)
from agentq.observe.events import emit_event
from agentq.observe.logs import configure_process_logging, route_core_logs

__all__ = [
    "CorrelationFilter",
    "LLMCall",
    "ToolCall",
    "api_metrics",
    "bind",
    "configure_process_logging",
    "emit_event",
    "enabled",
    "flush",
    "llm_call",
    "metrics",
    "record_budget_refusal",
    "record_dead_letter",
    "record_run",
    "record_submitted",
    "route_core_logs",
    "task_context",
    "tenant_soft_cap_crossed",
    "tool_call",
]
