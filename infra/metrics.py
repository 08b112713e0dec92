"""The metrics the alarms and the dashboard read: the core's EMF metrics by the names and
dimensions of ``agentq.observe.names`` (the module the emitting code uses), and SEARCH
expressions for those whose dimension values are only known at run time (the model, the tool):
one line per value that has reported."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cw

from agentq.core.models import TaskStatus
from agentq.observe import names
from infra.functions import Functions

OUTCOMES = tuple(s.value for s in TaskStatus if s.terminal)
TASK_EVENTS = (names.STEPS_COMMITTED, names.DLQ_MOVES, names.TENANT_SOFT_CAP_CROSSED)
TOKEN_METRICS = (names.TOKENS_IN, names.TOKENS_OUT)
ONE_MINUTE = cdk.Duration.minutes(1)
FIVE_MINUTES = cdk.Duration.minutes(5)


def agentq_metric(
    name: str,
    statistic: str = "Sum",
    period: cdk.Duration = FIVE_MINUTES,
    label: str | None = None,
    *,
    service: str = names.EXECUTOR,
    **dimensions: str,
) -> cw.Metric:
    return cw.Metric(
        namespace=names.NAMESPACE,
        metric_name=name,
        dimensions_map={names.SERVICE: service, **dimensions},
        statistic=statistic,
        period=period,
        label=label or name,
    )


def search_expression(metric: str, dimensions: tuple[str, ...], statistic: str, period: cdk.Duration) -> str:
    """One series per value of the dimensions besides ``service``, found among this
    namespace's metrics with exactly ``dimensions``."""
    schema = ",".join([names.NAMESPACE, *dimensions])
    return f"SEARCH('{{{schema}}} {names.SERVICE}=\"{names.EXECUTOR}\" MetricName=\"{metric}\"', '{statistic}', {int(period.to_seconds())})"


def per_value(metric: str, dimensions: tuple[str, ...], period: cdk.Duration, label: str) -> cw.SearchExpression:
    """Each series is labelled ``label`` and its dimension value (the model, the tool)."""
    return cw.SearchExpression(
        expression=search_expression(metric, dimensions, "Sum", period), label=label, period=period
    )


def tokens_per_minute() -> list[cw.IMetric]:
    """Tokens in and out per model (models are whatever tasks ask for, so SEARCH finds them),
    and the total across models: what the budgets are spent on, minute by minute."""
    lines: list[cw.IMetric] = [per_value(m, names.TOKEN_DIMENSIONS, ONE_MINUTE, m) for m in TOKEN_METRICS]
    total = " + ".join(f"SUM({search_expression(m, names.TOKEN_DIMENSIONS, 'Sum', ONE_MINUTE)})" for m in TOKEN_METRICS)
    lines.append(cw.MathExpression(expression=total, using_metrics={}, label="all models, in + out", period=ONE_MINUTE))
    return lines


def pickup_p99(tier: str | None = None) -> cw.Metric:
    """Submit to first claim, p99: all tiers (``{service}``), or one tier's (``{service, tier}``),
    which is what that tier's pickup objective is about."""
    if tier is None:
        return agentq_metric(names.PICKUP_LATENCY, "p99", FIVE_MINUTES, "pickup latency p99")
    return agentq_metric(names.PICKUP_LATENCY, "p99", FIVE_MINUTES, f"{tier} pickup latency p99", **{names.TIER: tier})


def executor_error_rate(fns: Functions) -> cw.MathExpression:
    """Invocations ending in an error (crash, timeout), in percent of all; a failed record is
    reported as a batch item failure and is not an error."""
    return cw.MathExpression(
        expression="IF(invocations > 0, 100 * errors / invocations, 0)",
        using_metrics={
            "errors": fns.executor.metric_errors(period=FIVE_MINUTES, statistic="Sum"),
            "invocations": fns.executor.metric_invocations(period=FIVE_MINUTES, statistic="Sum"),
        },
        label="executor error rate %",
        period=FIVE_MINUTES,
    )
