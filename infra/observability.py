"""What an operator watches: alarms on an SNS topic (``infra/alarms.py``) and one dashboard per
environment (``infra/dashboard.py``), over the metrics of ``infra/metrics.py``.

Task metrics are the core's EMF metrics (``agentq.observe``), written by the Lambda executor
and the Fargate worker alike (``service=executor``) and by the API (``service=api``). Their
names and dimensions come from ``agentq.observe.names``, the module the emitting code uses.

Built in two steps: the topic and the alarms of the core first (the optional parts, the events
hub and the workspace tier, alarm to the same topic and add theirs to ``alarms``), the dashboard
last (``add_dashboard``), once every alarm and every queue of the stack exists, so its alarm
widget and its DLQ graph leave none out.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.resources import TIERS
from infra.alarms import alarm_topic, build_alarms
from infra.api import Api
from infra.dashboard import Queues, build_dashboard
from infra.data import Data
from infra.functions import Functions
from infra.settings import EnvironmentSettings


@dataclass
class Observability:
    topic: sns.Topic
    alarms: list[cw.Alarm]  # every alarm of the stack: the optional parts add theirs
    dashboard: cw.Dashboard | None = None  # made last (add_dashboard)


def build_observability(
    scope: Construct,
    cfg: EnvironmentSettings,
    data: Data,
    fns: Functions,
    machine: sfn.StateMachine,
    api: Api,
) -> Observability:
    topic = alarm_topic(scope, cfg)
    return Observability(topic=topic, alarms=build_alarms(scope, cfg, data, fns, machine, api, topic))


def add_dashboard(
    scope: Construct,
    env_name: str,
    cfg: EnvironmentSettings,
    data: Data,
    fns: Functions,
    machine: sfn.StateMachine,
    api: Api,
    observability: Observability,
    workspace: tuple[dict[str, sqs.Queue], dict[str, sqs.Queue]] | None = None,
) -> cw.Dashboard:
    """The dashboard, over every alarm in ``observability`` and every queue: the tier queues and
    DLQs, the reaper's and the webhooks' DLQs, and with the workspace tier (its queues, its
    DLQs) its pool's, labelled ``workspace-<tier>``."""
    queues = Queues(
        queues=dict(data.queues),
        dlqs={**data.dlqs, "reaper": fns.reaper_dlq, "webhooks": data.webhooks_dlq},
    )
    if workspace is not None:
        pool_queues, pool_dlqs = workspace
        queues.queues.update({f"workspace-{t}": pool_queues[t] for t in TIERS})
        queues.dlqs.update({f"workspace-{t}": pool_dlqs[t] for t in TIERS})
    observability.dashboard = build_dashboard(
        scope, env_name, cfg.prefix, queues, fns, machine, api, observability.alarms
    )
    return observability.dashboard
