"""The alarms, and the SNS topic they publish to (``{prefix}-alarms``, encrypted under a key
CloudWatch may use). Each alarm's description says what broke and where to read on; the DLQ ones
name their runbook in docs/DEPLOY.md. A state a tenant causes (a soft cap, a running limit, an
open circuit) alarms without an OK action: it is news, not an outage that ends."""

from __future__ import annotations

from dataclasses import dataclass, field

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.core.caps import SCOPES
from agentq.observe import names
from agentq.resources import TIERS
from infra.api import Api
from infra.api_functions import schedule_group_name
from infra.data import Data
from infra.functions import Functions
from infra.metrics import FIVE_MINUTES, ONE_MINUTE, agentq_metric, executor_error_rate, pickup_p99
from infra.retention import removal_policy
from infra.settings import EnvironmentSettings

REAPER_BEHIND_SECONDS = 3600  # the age of the reaper's stream records that alarms: an hour of the stream's 24


def alarm_topic(scope: Construct, cfg: EnvironmentSettings) -> sns.Topic:
    """CloudWatch cannot publish to a topic under the AWS-managed SNS key: a key of our own
    whose policy lets CloudWatch use it."""
    prefix = cfg.prefix
    key = kms.Key(
        scope,
        "AlarmTopicKey",
        description=f"{prefix} alarm topic",
        enable_key_rotation=True,
        removal_policy=removal_policy(cfg),
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
    return topic


@dataclass
class AlarmFactory:
    """Makes the alarms alike: ``{prefix}-{kebab-id}``, at or above the threshold, missing data
    not breaching, to the topic (alarm and, with ``ok``, OK); keeps them in ``alarms``."""

    scope: Construct
    prefix: str
    topic: sns.Topic
    alarms: list[cw.Alarm] = field(default_factory=list)

    def __call__(
        self, cid: str, metric: cw.IMetric, threshold: float, description: str, *, periods: int = 1, ok: bool = True
    ) -> cw.Alarm:
        action = cw_actions.SnsAction(self.topic)
        a = cw.Alarm(
            self.scope,
            cid,
            alarm_name=f"{self.prefix}-{_kebab(cid)}",
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
        self.alarms.append(a)
        return a


def build_alarms(
    scope: Construct,
    cfg: EnvironmentSettings,
    data: Data,
    fns: Functions,
    machine: sfn.StateMachine,
    api: Api,
    topic: sns.Topic,
) -> list[cw.Alarm]:
    alarm = AlarmFactory(scope, cfg.prefix, topic)
    queue_alarms(alarm, cfg, data, fns)
    task_alarms(alarm, cfg, fns)
    dependency_alarms(alarm, cfg, data, fns, machine, api)
    return alarm.alarms


def queue_alarms(alarm: AlarmFactory, cfg: EnvironmentSettings, data: Data, fns: Functions) -> None:
    """A message in a DLQ; a tier's queue nobody takes from."""
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
            periods=cfg.alarms.evaluation_minutes,
        )
    alarm(
        "ReaperDlqNotEmpty",
        fns.reaper_dlq.metric_approximate_number_of_messages_visible(period=ONE_MINUTE, statistic="Maximum"),
        cfg.alarms.dlq_messages,
        "the reaper gave up on a stream batch: some expired tasks' items and payloads were not deleted. "
        "Runbook: docs/DEPLOY.md#runbook-a-message-in-the-reaper-dlq",
    )
    # The stream keeps a record 24 h: a reaper that falls behind (throttled, failing before its
    # retries count) loses what the stream drops, silently; the DLQ sees only batches given up.
    alarm(
        "ReaperIteratorAge",
        fns.reaper.metric("IteratorAge", period=FIVE_MINUTES, statistic="Maximum"),
        REAPER_BEHIND_SECONDS * 1000,  # Lambda reports it in milliseconds
        f"the reaper reads table stream records over {REAPER_BEHIND_SECONDS // 3600} h old: it is falling behind "
        "(throttled, or failing), and a record the stream drops at 24 h is an expired task never purged. Read "
        "its log group and its throttles; runbook: docs/DEPLOY.md#runbook-a-message-in-the-reaper-dlq",
    )
    # The sweeper runs from a schedule with no retry of EventBridge's, no DLQ and no destination:
    # a failing sweep is seen nowhere else, and it is what resumes a task whose message was lost.
    every = cfg.sweeper.every_minutes
    alarm(
        "SweeperErrors",
        fns.sweeper.metric_errors(period=cdk.Duration.minutes(every), statistic="Sum"),
        1,
        f"a sweep failed (an error or a timeout) in the last {every} minutes: unfinished tasks left with no worker "
        "and no message are not re-enqueued while it fails; read the sweeper function's log group",
    )


def task_alarms(alarm: AlarmFactory, cfg: EnvironmentSettings, fns: Functions) -> None:
    """Tasks picked up late, executor invocations failing, tenants at their caps and limits."""
    # One per tier, at that tier's objective: a fleet-wide p99 against the slowest tier's
    # objective let a high-tier task wait many times its objective unremarked.
    for tier in TIERS:
        objective = cfg.alarms.pickup_objective_seconds[tier]
        alarm(
            f"{tier.capitalize()}PickupLatency",
            pickup_p99(tier),
            objective,
            f"{tier} tier: p99 time from submit to first claim is at or above its pickup objective ({objective} s); "
            f"read the {tier} queue's age of oldest message and the executor's throttles and errors",
        )
    alarm(
        "ExecutorErrorRate",
        executor_error_rate(fns),
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
    for scope in SCOPES:  # one series per scope kind, whatever the users: the event names who
        alarm(
            f"ScopeCap80{scope.capitalize()}",
            agentq_metric(names.SCOPE_CAP_CROSSED, "Sum", FIVE_MINUTES, **{names.SCOPE: scope}),
            1,
            f"a {scope}'s window crossed 80% of one of its caps (core.caps: tokens or dollars, an hour or a day); "
            "the ScopeCapCrossed event names the tenant, the name, the window and the amounts",
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


def dependency_alarms(
    alarm: AlarmFactory, cfg: EnvironmentSettings, data: Data, fns: Functions, machine: sfn.StateMachine, api: Api
) -> None:
    """What tasks lean on beyond the executor: callbacks, model providers, fan-out, event streams, the API."""
    alarm(
        "WebhooksDlqNotEmpty",
        data.webhooks_dlq.metric_approximate_number_of_messages_visible(period=FIVE_MINUTES, statistic="Maximum"),
        cfg.alarms.dlq_messages,  # as every DLQ's
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
        "five minutes: watchers fall back to polling; read its logs (a stream ends itself at 14 minutes, before the "
        "function's timeout, and the client resumes: a timeout is a fault)",
    )
    # A tenant schedule's fire the Scheduler could not send after its retries: sent to the
    # normal DLQ (whose own alarm fires too), or lost (the DLQ refused it, or dropped); each
    # count filled with 0, so one that reports alone still sums.
    group = {"ScheduleGroup": schedule_group_name(cfg)}
    alarm(
        "ScheduleFiresFailed",
        cw.MathExpression(
            expression="FILL(dlq, 0) + FILL(undelivered, 0) + FILL(dropped, 0)",  # each is sent only when not 0
            using_metrics={
                key: cw.Metric(
                    namespace="AWS/Scheduler",
                    metric_name=name,
                    dimensions_map=group,
                    statistic="Sum",
                    period=FIVE_MINUTES,
                )
                for key, name in (
                    ("dlq", "InvocationsSentToDeadLetterCount"),
                    ("undelivered", "InvocationsFailedToBeSentToDeadLetterCount"),
                    ("dropped", "InvocationDroppedCount"),
                )
            },
            label="schedule fires not delivered",
            period=FIVE_MINUTES,
        ),
        1,
        "EventBridge Scheduler could not send a tenant schedule's fire to the normal tier queue after its retries: "
        "it is in the normal DLQ (runbook: docs/DEPLOY.md#runbook-redriving-a-dlq; a redriven fire fires again, "
        "coalesced) or, if the DLQ refused it, lost (read the scheduler role's grants and the queue's policy)",
    )
    alarm(
        "Api5xx",
        api.rest_api.metric_server_error(period=FIVE_MINUTES, statistic="Sum"),
        5,
        "the API answered 5xx five times or more in five minutes",
    )


def _kebab(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("-")
        out.append(ch.lower())
    return "".join(out).replace("5xx", "-5xx")
