"""The dashboard an operator watches (``{prefix}-overview``), row by row: the queues (every
queue's depth, every DLQ's), the executor, what tasks end as and how fast they start, what they
spend and trip on, and the state of every alarm. Task metrics come from the Lambda executor and
the Fargate worker alike (``service=executor``), submissions from the API (``service=api``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.observe import names
from agentq.resources import TIERS
from infra.api import Api
from infra.functions import Functions
from infra.metrics import (
    FIVE_MINUTES,
    ONE_MINUTE,
    OUTCOMES,
    TASK_EVENTS,
    agentq_metric,
    executor_error_rate,
    per_value,
    pickup_p99,
    tokens_per_minute,
)


@dataclass
class Queues:
    """What the queue row draws, by label: the task queues (a tier's, ``workspace-<tier>``) and
    every dead-letter queue of the stack (the tiers', the reaper's, the webhooks', the
    workspace pool's): the DLQ runbook's check is that graph dropping to 0."""

    queues: dict[str, sqs.Queue]
    dlqs: dict[str, sqs.Queue]


def build_dashboard(
    scope: Construct,
    env_name: str,
    prefix: str,
    queues: Queues,
    fns: Functions,
    machine: sfn.StateMachine,
    api: Api,
    alarms: list[cw.Alarm],
) -> cw.Dashboard:
    dashboard = cw.Dashboard(
        scope,
        "Dashboard",
        dashboard_name=f"{prefix}-overview",
        default_interval=cdk.Duration.hours(3),
    )
    dashboard.add_widgets(
        cw.TextWidget(
            markdown=f"# agentq `{env_name}` ({prefix})\nQueues, executor, task outcomes and latency. "
            "Alarms go to the `" + f"{prefix}-alarms` topic; DLQ runbook in docs/DEPLOY.md.",
            width=24,
            height=2,
        )
    )
    dashboard.add_widgets(*queue_row(queues))
    dashboard.add_widgets(*executor_row(queues, fns))
    dashboard.add_widgets(*task_row())
    dashboard.add_widgets(*traffic_row(machine, api))
    dashboard.add_widgets(*spend_row())
    # every alarm of the stack (the optional parts' too): a row of the widget holds about six
    dashboard.add_widgets(
        cw.AlarmStatusWidget(title="Alarms", alarms=alarms, width=24, height=max(4, 2 + math.ceil(len(alarms) / 6)))
    )
    return dashboard


def _depth(queue: sqs.Queue, label: str) -> cw.Metric:
    return queue.metric_approximate_number_of_messages_visible(period=ONE_MINUTE, statistic="Maximum", label=label)


def queue_row(queues: Queues) -> list[cw.IWidget]:
    return [
        cw.GraphWidget(
            title="Queue depth (visible) per queue",
            left=[_depth(q, label) for label, q in queues.queues.items()],
            width=8,
        ),
        cw.GraphWidget(
            title="Age of oldest message per tier (s)",
            left=[
                queues.queues[t].metric_approximate_age_of_oldest_message(
                    period=ONE_MINUTE, statistic="Maximum", label=t
                )
                for t in TIERS
            ],
            width=8,
        ),
        cw.GraphWidget(
            title="DLQ depth: every dead-letter queue",
            left=[_depth(q, label) for label, q in queues.dlqs.items()],
            width=8,
        ),
    ]


def executor_row(queues: Queues, fns: Functions) -> list[cw.IWidget]:
    in_flight = [
        queues.queues[t].metric_approximate_number_of_messages_not_visible(
            period=ONE_MINUTE, statistic="Maximum", label=t
        )
        for t in TIERS
    ]
    return [
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
            right=[executor_error_rate(fns)],
            width=8,
        ),
        cw.GraphWidget(
            title="Executor duration (ms)",
            left=[
                fns.executor.metric_duration(period=ONE_MINUTE, statistic=s, label=s) for s in ("p50", "p99", "Maximum")
            ],
            width=8,
        ),
    ]


def task_row() -> list[cw.IWidget]:
    return [
        cw.GraphWidget(
            title="Tasks by outcome",
            left=[agentq_metric(names.task_outcome(o), "Sum", FIVE_MINUTES, o) for o in OUTCOMES],
            stacked=True,
            width=8,
        ),
        cw.GraphWidget(
            title="Pickup and resume latency p99 (s)",
            left=[
                *(pickup_p99(tier) for tier in TIERS),
                agentq_metric(names.RESUME_LATENCY, "p99", FIVE_MINUTES, "resume latency p99"),
            ],
            width=8,
        ),
        cw.GraphWidget(title="Tokens per minute, per model", left=tokens_per_minute(), width=8),
    ]


def traffic_row(machine: sfn.StateMachine, api: Api) -> list[cw.IWidget]:
    return [
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
    ]


def spend_row() -> list[cw.IWidget]:
    return [
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
            title="Budget refusals (task budget, tenant window, scope cap)",
            left=[
                agentq_metric(names.BUDGET_REFUSALS, "Sum", FIVE_MINUTES, budget, **{names.BUDGET: budget})
                for budget in names.BUDGETS
            ],
            width=8,
        ),
    ]
