"""What an operator watches: one dashboard per environment, and alarms on an SNS topic.

Task metrics are the core's EMF metrics (``agentq.observe``), written by the Lambda executor
and the Fargate worker alike (``service=executor``) and by the API (``service=api``). Their
names and dimensions come from ``agentq.observe.names``, the module the emitting code uses.
Metrics with a dimension whose values are only known at run time (the model, the tool) are
drawn with SEARCH expressions: one line per value that has reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.core.models import TaskStatus
from agentq.observe import names
from agentq.resources import TIERS
from infra.api import Api
from infra.data import Data
from infra.functions import Functions
from infra.settings import EnvironmentSettings

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


@dataclass
class Observability:
    topic: sns.Topic
    alarms: list[cw.Alarm]
    dashboard: cw.Dashboard


def build_observability(
    scope: Construct,
    env_name: str,
    cfg: EnvironmentSettings,
    data: Data,
    fns: Functions,
    machine: sfn.StateMachine,
    api: Api,
) -> Observability:
    prefix = cfg.prefix
    # CloudWatch cannot publish to a topic under the AWS-managed SNS key: a key of our own
    # whose policy lets CloudWatch use it.
    key = kms.Key(
        scope,
        "AlarmTopicKey",
        description=f"{prefix} alarm topic",
        enable_key_rotation=True,
        removal_policy=cdk.RemovalPolicy.DESTROY if cfg.destroy else cdk.RemovalPolicy.RETAIN,
    )
    key.add_to_resource_policy(
        iam.PolicyStatement(
            sid="CloudWatchAlarmsPublish",
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"],
            resources=["*"],  # in a key policy "*" means this key
            conditions={"StringEquals": {"aws:SourceAccount": cdk.Aws.ACCOUNT_ID}},
        )
    )
    topic = sns.Topic(scope, "AlarmTopic", topic_name=f"{prefix}-alarms", master_key=key, enforce_ssl=True)
    for email in cfg.alarms.emails:
        topic.add_subscription(subs.EmailSubscription(email))
    action = cw_actions.SnsAction(topic)
    alarms: list[cw.Alarm] = []
    evaluation = cfg.alarms.evaluation_minutes

    def alarm(
        cid: str, metric: cw.IMetric, threshold: float, description: str, *, periods: int = 1, ok: bool = True
    ) -> cw.Alarm:
        a = cw.Alarm(
            scope,
            cid,
            alarm_name=f"{prefix}-{_kebab(cid)}",
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            evaluation_periods=periods,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        a.add_alarm_action(action)
        if ok:
            a.add_ok_action(action)
        alarms.append(a)
        return a

    for tier in TIERS:
        objective = cfg.alarms.pickup_objective_seconds[tier]
        alarm(
            f"{tier.capitalize()}DlqNotEmpty",
            data.dlqs[tier].metric_approximate_number_of_messages_visible(period=ONE_MINUTE, statistic="Maximum"),
            cfg.alarms.dlq_messages,
            f"{tier} DLQ holds a message: a task failed after all retries. Runbook: docs/DEPLOY.md#runbook-redriving-a-dlq",
        )
        # The age of the oldest message counts messages a consumer holds too, and a healthy
        # executor holds one for up to a whole slice. Past objective + slice nobody is taking it.
        alarm(
            f"{tier.capitalize()}QueueStarved",
            data.queues[tier].metric_approximate_age_of_oldest_message(period=ONE_MINUTE, statistic="Maximum"),
            objective + cfg.executor.timeout_seconds,
            f"{tier} queue: a message waited longer than the pickup objective ({objective} s) plus one executor "
            f"slice ({cfg.executor.timeout_seconds} s): consumers are stuck, throttled or absent",
            periods=evaluation,
        )
    alarm(
        "ReaperDlqNotEmpty",
        fns.reaper_dlq.metric_approximate_number_of_messages_visible(period=ONE_MINUTE, statistic="Maximum"),
        cfg.alarms.dlq_messages,
        "the reaper gave up on a stream batch: some expired tasks' items and payloads were not deleted. "
        "Runbook: docs/DEPLOY.md#runbook-a-message-in-the-reaper-dlq",
    )
    pickup_p99 = agentq_metric(names.PICKUP_LATENCY, "p99", FIVE_MINUTES, "pickup latency p99")
    alarm(
        "PickupLatency",
        pickup_p99,
        max(cfg.alarms.pickup_objective_seconds.values()),
        "p99 time from submit to first claim is above the slowest tier's pickup objective",
    )
    error_rate = cw.MathExpression(
        expression="IF(invocations > 0, 100 * errors / invocations, 0)",
        using_metrics={
            "errors": fns.executor.metric_errors(period=FIVE_MINUTES, statistic="Sum"),
            "invocations": fns.executor.metric_invocations(period=FIVE_MINUTES, statistic="Sum"),
        },
        label="executor error rate %",
        period=FIVE_MINUTES,
    )
    alarm(
        "ExecutorErrorRate",
        error_rate,
        cfg.alarms.executor_error_rate_percent,
        f"executor invocations ending in an error (crash, timeout) above {cfg.alarms.executor_error_rate_percent}%; "
        "failed records are reported as batch item failures and are not errors",
    )
    alarm(
        "TenantSoftCap",
        agentq_metric(names.TENANT_SOFT_CAP_CROSSED, "Sum", FIVE_MINUTES),
        1,
        "a tenant crossed 80% (its soft cap) of its hourly token window; the event names the tenant",
        ok=False,
    )
    alarm(
        "TenantHeldAtLimit",
        agentq_metric(names.TASKS_HELD_AT_LIMIT, "Sum", FIVE_MINUTES),
        1,
        "tasks kept waiting at a running limit for 15 minutes: a tenant (or a concurrency key) is held at its "
        "limit; the TenantHeldAtLimit event names the tenant (raise its override with `agentq tenants limit`)",
        periods=3,
        ok=False,
    )
    alarm(
        "WebhooksDlqNotEmpty",
        data.webhooks_dlq.metric_approximate_number_of_messages_visible(period=FIVE_MINUTES, statistic="Maximum"),
        1,
        "a task-end callback could not be delivered (its receiver kept failing, or its URL was refused); read "
        "the message's agentq-reason in the webhooks DLQ",
    )
    alarm(
        "CircuitOpened",
        agentq_metric(names.CIRCUIT_OPENED, "Sum", FIVE_MINUTES),
        1,
        "a provider circuit opened (repeated failed calls to one model): its tasks wait, deferred, until a probe "
        "succeeds; the CircuitOpened event names the provider and model",
        ok=False,
    )
    alarm(
        "FanoutExecutionsFailed",
        machine.metric_failed(period=FIVE_MINUTES, statistic="Sum"),
        1,
        "a fan-out execution failed: its parent task may not be woken; read the execution's history (docs/DEPLOY.md)",
    )
    alarm(
        "EventStreamFailures",
        cw.MathExpression(
            expression="errors + throttles",
            using_metrics={
                "errors": fns.events.metric_errors(period=FIVE_MINUTES, statistic="Sum"),
                "throttles": fns.events.metric_throttles(period=FIVE_MINUTES, statistic="Sum"),
            },
            label="event stream errors and throttles",
            period=FIVE_MINUTES,
        ),
        5,
        "the task event stream function (GET /tasks/{id}/events) failed or was throttled five times or more in "
        "five minutes: watchers fall back to polling; read its logs (a stream ending at 15 minutes is not an error)",
    )
    alarm(
        "Api5xx",
        api.rest_api.metric_server_error(period=FIVE_MINUTES, statistic="Sum"),
        5,
        "the API answered 5xx five times or more in five minutes",
    )

    dashboard = cw.Dashboard(
        scope,
        "Dashboard",
        dashboard_name=f"{prefix}-overview",
        default_interval=cdk.Duration.hours(3),
    )
    visible = [
        data.queues[t].metric_approximate_number_of_messages_visible(period=ONE_MINUTE, statistic="Maximum", label=t)
        for t in TIERS
    ]
    in_flight = [
        data.queues[t].metric_approximate_number_of_messages_not_visible(
            period=ONE_MINUTE, statistic="Maximum", label=t
        )
        for t in TIERS
    ]
    dashboard.add_widgets(
        cw.TextWidget(
            markdown=f"# agentq `{env_name}` ({prefix})\nQueues, executor, task outcomes and latency. "
            "Alarms go to the `" + f"{prefix}-alarms` topic; DLQ runbook in docs/DEPLOY.md.",
            width=24,
            height=2,
        )
    )
    dashboard.add_widgets(
        cw.GraphWidget(title="Queue depth (visible) per tier", left=visible, width=8),
        cw.GraphWidget(
            title="Age of oldest message per tier (s)",
            left=[
                data.queues[t].metric_approximate_age_of_oldest_message(period=ONE_MINUTE, statistic="Maximum", label=t)
                for t in TIERS
            ],
            width=8,
        ),
        cw.GraphWidget(
            title="DLQ depth per tier, and the reaper's",
            left=[
                data.dlqs[t].metric_approximate_number_of_messages_visible(
                    period=ONE_MINUTE, statistic="Maximum", label=t
                )
                for t in TIERS
            ]
            + [
                fns.reaper_dlq.metric_approximate_number_of_messages_visible(
                    period=ONE_MINUTE, statistic="Maximum", label="reaper"
                )
            ],
            width=8,
        ),
    )
    dashboard.add_widgets(
        cw.GraphWidget(
            title="Active tasks (messages in flight)",
            left=[
                cw.MathExpression(
                    expression="+".join(f"m{i}" for i in range(len(TIERS))),
                    using_metrics={f"m{i}": m for i, m in enumerate(in_flight)},
                    label="all tiers",
                    period=ONE_MINUTE,
                ),
                *in_flight,
            ],
            width=8,
        ),
        cw.GraphWidget(
            title="Executor invocations / errors / throttles",
            left=[
                fns.executor.metric_invocations(period=ONE_MINUTE, statistic="Sum"),
                fns.executor.metric_errors(period=ONE_MINUTE, statistic="Sum"),
                fns.executor.metric_throttles(period=ONE_MINUTE, statistic="Sum"),
            ],
            right=[error_rate],
            width=8,
        ),
        cw.GraphWidget(
            title="Executor duration (ms)",
            left=[
                fns.executor.metric_duration(period=ONE_MINUTE, statistic=s, label=s) for s in ("p50", "p99", "Maximum")
            ],
            width=8,
        ),
    )
    dashboard.add_widgets(
        cw.GraphWidget(
            title="Tasks by outcome",
            left=[agentq_metric(names.task_outcome(o), "Sum", FIVE_MINUTES, o) for o in OUTCOMES],
            stacked=True,
            width=8,
        ),
        cw.GraphWidget(
            title="Pickup and resume latency p99 (s)",
            left=[pickup_p99, agentq_metric(names.RESUME_LATENCY, "p99", FIVE_MINUTES, "resume latency p99")],
            width=8,
        ),
        cw.GraphWidget(title="Tokens per minute, per model", left=tokens_per_minute(), width=8),
    )
    dashboard.add_widgets(
        cw.GraphWidget(
            title="Steps, DLQ moves, tenant soft caps",
            left=[agentq_metric(m, "Sum", FIVE_MINUTES, m) for m in TASK_EVENTS],
            width=8,
        ),
        cw.GraphWidget(
            title="Fan-out executions",
            left=[
                machine.metric_started(period=FIVE_MINUTES, statistic="Sum"),
                machine.metric_succeeded(period=FIVE_MINUTES, statistic="Sum"),
                machine.metric_failed(period=FIVE_MINUTES, statistic="Sum"),
                machine.metric_timed_out(period=FIVE_MINUTES, statistic="Sum"),
            ],
            width=8,
        ),
        cw.GraphWidget(
            title="API requests / 4xx / 5xx / latency p99",
            left=[
                api.rest_api.metric_count(period=ONE_MINUTE, statistic="Sum"),
                api.rest_api.metric_client_error(period=ONE_MINUTE, statistic="Sum"),
                api.rest_api.metric_server_error(period=ONE_MINUTE, statistic="Sum"),
            ],
            right=[api.rest_api.metric_latency(period=ONE_MINUTE, statistic="p99")],
            width=8,
        ),
    )
    dashboard.add_widgets(
        cw.GraphWidget(
            title="Tasks submitted (API)",
            left=[agentq_metric(names.TASKS_SUBMITTED, "Sum", FIVE_MINUTES, "submitted", service=names.API)],
            width=8,
        ),
        cw.GraphWidget(
            title="Tool errors per tool",
            left=[per_value(names.TOOL_ERRORS, names.TOOL_DIMENSIONS, FIVE_MINUTES, names.TOOL_ERRORS)],
            width=8,
        ),
        cw.GraphWidget(
            title="Budget refusals (task budget, tenant window)",
            left=[
                agentq_metric(names.BUDGET_REFUSALS, "Sum", FIVE_MINUTES, budget, **{names.BUDGET: budget})
                for budget in names.BUDGETS
            ],
            width=8,
        ),
    )
    dashboard.add_widgets(cw.AlarmStatusWidget(title="Alarms", alarms=alarms, width=24, height=4))
    return Observability(topic=topic, alarms=alarms, dashboard=dashboard)


def _kebab(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("-")
        out.append(ch.lower())
    return "".join(out).replace("5xx", "-5xx")
