"""What CloudWatch knows agentq's metrics by: namespace, the ``service`` dimension's values,
the other dimensions and the metric names.

One definition for the code that emits them (``agentq.observe``) and the dashboard and alarms
that read them (``infra/metrics.py``): a renamed metric cannot leave a widget drawing
nothing.
"""

from __future__ import annotations

from typing import Literal, get_args

NAMESPACE = "agentq"

# Dimensions. ``service`` is powertools' default dimension; its value is the component's role,
# not its deployment: the Lambda executor and the Fargate worker both run tasks, so their
# metrics share ``executor`` and add up on one graph.
SERVICE = "service"
EXECUTOR = "executor"
API = "api"
MODEL = "model"  # the model the provider reported (token metrics)
TOOL = "tool"  # a registered tool's name (tool_errors)
BUDGET = "budget"  # which budget refused: "task" (the task tree's own), "tenant" (its hourly window), "cap" (a scope's)
TIER = "tier"  # a task's tier (its priority: high, normal or low; pickup_latency's per-tier series)
SCOPE = "scope"  # a scope cap's kind: user, agent or key (core.caps; the name is in the event: bounded series)

# Values a dimension falls back to, so the number of metric series stays bounded whatever the
# model or the tasks ask for.
UNREGISTERED_TOOL = "unregistered"  # a tool name the model made up
OTHER_MODEL = "other"  # past MAX_MODELS distinct models in one process
MAX_MODELS = 20  # distinct model values a process keeps in a metric's dimensions or attributes

# service=executor, dimensions {service}
STEPS_COMMITTED = "steps_committed"
PICKUP_LATENCY = "pickup_latency"  # also under {service, tier}: each tier has its own objective and alarm
RESUME_LATENCY = "resume_latency"
DLQ_MOVES = "dlq_moves"
TENANT_SOFT_CAP_CROSSED = "tenant_soft_cap_crossed"
# dimensions {service, scope}: a scope's window crossed 80 % of its cap (once a window; the
# tenant, the name, the window and the amounts are in the ScopeCapCrossed event)
SCOPE_CAP_CROSSED = "scope_cap_crossed"
# a task parked because its tenant (or its concurrency key) was at its running limit
# (dimension: held_by = tenant | key; the tenant itself is in the TenantHeldAtLimit event)
TASKS_HELD_AT_LIMIT = "tasks_held_at_limit"
HELD_BY = "held_by"
# service=executor, dimensions {service, model}: one EMF document per LLM call
TOKENS_IN = "tokens_in"  # every input token the model read: uncached, cache writes and cache reads
TOKENS_OUT = "tokens_out"
CACHE_READ_TOKENS = "cache_read_tokens"  # part of tokens_in; sent only when non-zero
CACHE_WRITE_TOKENS = "cache_write_tokens"  # part of tokens_in; sent only when non-zero
# service=executor, dimensions {service, tool}
TOOL_ERRORS = "tool_errors"
# service=executor, dimensions {service, budget}
BUDGET_REFUSALS = "budget_refusals"
# service=executor, dimensions {service}: tokens of calls counted at their holds, outcome unknown
# (ARCHITECTURE 4); the tenant is in the UnknownUsageCounted event, not a dimension (bounded series)
UNKNOWN_TOKENS = "unknown_tokens"
# service=api, dimensions {service}
TASKS_SUBMITTED = "tasks_submitted"
# service=executor, no dimension: unfinished tasks with no worker and no message, re-enqueued
TASKS_SWEPT = "tasks_swept"
# service=executor, dimensions {service, decision}: a call a policy rule took part in
# (core.engine._policy); decision is allow, deny or ask, or would_deny/would_ask for a log_only
# rule's (bounded series: the rule is in the PolicyDecision event, not a dimension)
POLICY_DECISIONS = "policy_decisions"
DECISION = "decision"
CIRCUIT_OPENED = "circuit_opened"  # a provider/model or tool circuit opened (dimension: circuit)
CIRCUIT_CLOSED = "circuit_closed"
CIRCUIT = "circuit"
# An answer graded against its task's outcome (core.engine._grade); grade is passed, below_bar
# (the agent tries again, or the task ends failed_outcome) or error (a judge failed).
GRADES = "grades"
GRADE = "grade"

TOKEN_DIMENSIONS = (SERVICE, MODEL)
TOOL_DIMENSIONS = (SERVICE, TOOL)
BUDGET_DIMENSIONS = (SERVICE, BUDGET)
# What refused a reservation (``budget=``): a task tree's budget, a tenant's hourly window, a
# scope's cap (storage/scope_caps.py). The type ``record_budget_refusal`` takes, and what the
# dashboard draws a line for: one list, so a new kind cannot be recorded and drawn nowhere.
Budget = Literal["task", "tenant", "cap"]
BUDGETS: tuple[Budget, ...] = get_args(Budget)


def task_outcome(status: str) -> str:
    """``tasks_succeeded``, ``tasks_failed``, ...: a task reached that terminal status."""
    return f"tasks_{status}"


def run_outcome(outcome: str) -> str:
    """``runs_finished``, ``runs_continue``, ...: how one claim of a task ended."""
    return f"runs_{outcome}"
