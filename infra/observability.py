"""What an operator watches: alarms on an SNS topic (``infra/alarms.py``) and one dashboard per
environment (``infra/dashboard.py``), over the metrics of ``infra/metrics.py``.

Task metrics are the core's EMF metrics (``agentq.observe``), written by the Lambda executor
and the Fargate worker alike (``service=executor``) and by the API (``service=api``). Their
names and dimensions come from ``agentq.observe.names``, the module the emitting code uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.alarms import alarm_topic, build_alarms
from infra.api import Api
from infra.dashboard import build_dashboard
from infra.data import Data
from infra.functions import Functions
from infra.settings import EnvironmentSettings


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
    topic = alarm_topic(scope, cfg)
    alarms = build_alarms(scope, cfg, data, fns, machine, api, topic)
    dashboard = build_dashboard(scope, env_name, cfg.prefix, data, fns, machine, api, alarms)
    return Observability(topic=topic, alarms=alarms, dashboard=dashboard)
