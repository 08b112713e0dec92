"""The agentq stack: everything one environment runs on (``cdk deploy -c env=dev|staging|prod``).

data         table (PITR, TTL, gsi1), payload bucket, tier queues + DLQs   infra/data.py
fan-out      Step Functions from agentq/asl/fanout.asl.json               here
functions    layers, executor (SQS), API, authorizer; least privilege      infra/functions.py
api          REST API, TOKEN authorizer, access logs, throttles, WAF       infra/api.py
worker       optional Fargate worker scaled on queue depth                infra/worker.py
observe      dashboard, alarms, SNS topic                                 infra/observability.py
"""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.api.console import CONSOLE_PATH
from agentq.resources import fanout_definition
from infra import nag
from infra.api import build_api
from infra.build_layers import ROOT, DepsLayer, build_deps_layer, build_user_layer
from infra.data import Data, build_data
from infra.functions import build_functions, log_retention
from infra.observability import build_observability
from infra.settings import EnvironmentSettings
from infra.worker import build_worker

ALLOW_UNBUILT_DEPS_LAYER = "agentq:allow-unbuilt-deps-layer"


class AgentqStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        env_name: str,
        settings: EnvironmentSettings,
        deps_layer: DepsLayer | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, description=f"agentq durable task queue ({env_name})", **kwargs)
        self.env_name = env_name
        self.settings = cfg = settings
        cdk.Tags.of(self).add("agentq:env", env_name)

        self.deps_layer = deps_layer or build_deps_layer(cfg.architecture)
        if not self.deps_layer.built and not self.node.try_get_context(ALLOW_UNBUILT_DEPS_LAYER):
            raise RuntimeError(
                f"{self.deps_layer.message}. The dependencies layer must be built before a deployable synth: "
                "run `.venv/bin/python infra/build_layers.py` where PyPI is reachable."
            )

        self.user_layer = self._user_layer(cfg)

        self.data = build_data(self, cfg)
        self.event_bus = (
            events.EventBus(self, "EventBus", event_bus_name=f"{cfg.prefix}-events")
            if cfg.event_bus == "stack"
            else None
        )
        self.state_machine = self._fanout(cfg, self.data)
        self.functions = build_functions(
            self, env_name, cfg, self.data, self.state_machine, self.deps_layer, self.user_layer
        )
        self.api = build_api(self, cfg, self.functions)
        self.worker = (
            build_worker(self, env_name, cfg, self.data, self.state_machine, self.functions.sandbox)
            if cfg.worker.enabled
            else None
        )
        self.observability = build_observability(
            self, env_name, cfg, self.data, self.functions, self.state_machine, self.api
        )

        cdk.CfnOutput(self, "ApiUrl", value=self.api.rest_api.url, description="AGENTQ_URL for the CLI and client")
        cdk.CfnOutput(
            self,
            "ConsoleUrl",
            value=self.api.rest_api.url_for_path(f"{CONSOLE_PATH}/"),
            description="the web console (it asks for an API key)",
        )
        cdk.CfnOutput(self, "TableName", value=self.data.table.table_name)
        cdk.CfnOutput(self, "PayloadBucket", value=self.data.payloads.bucket_name)
        cdk.CfnOutput(self, "StateMachineArn", value=self.state_machine.state_machine_arn)
        cdk.CfnOutput(self, "AlarmTopicArn", value=self.observability.topic.topic_arn)
        cdk.CfnOutput(self, "DashboardName", value=f"{cfg.prefix}-overview")
        nag.acknowledge(self)

    def _user_layer(self, cfg: EnvironmentSettings) -> DepsLayer | None:
        """Your tools' layer (``user_code``: paths relative to cdk.json, i.e. the project root)."""
        user = cfg.user_code
        if user is None:
            return None
        requirements = ROOT / user.requirements if user.requirements else None
        if requirements is not None and not requirements.is_file():
            raise ValueError(f"user_code.requirements: {requirements} is not a file")
        layer = build_user_layer(ROOT / user.package_dir, requirements, cfg.architecture)
        if not layer.built and not self.node.try_get_context(ALLOW_UNBUILT_DEPS_LAYER):
            raise RuntimeError(f"{layer.message}. The user code layer must be built before a deployable synth.")
        return layer

    def _fanout(self, cfg: EnvironmentSettings, data: Data) -> sfn.StateMachine:
        """The fan-out machine from the one ASL document the local stack runs too. Its queue
        URLs come from the execution input, so its role is granted the tier queues here."""
        log_group = logs.LogGroup(
            self,
            "FanoutLogs",
            log_group_name=f"/aws/vendedlogs/states/{cfg.names.state_machine}",
            retention=log_retention(cfg.log_retention_days),
            removal_policy=cdk.RemovalPolicy.DESTROY if cfg.destroy else cdk.RemovalPolicy.RETAIN,
        )
        machine = sfn.StateMachine(
            self,
            "Fanout",
            state_machine_name=cfg.names.state_machine,
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_string(json.dumps(fanout_definition())),
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=False),
        )
        machine.add_to_role_policy(
            iam.PolicyStatement(
                sid="RunChildrenWakeParent",
                actions=["sqs:SendMessage"],
                resources=[q.queue_arn for q in data.queues.values()],
            )
        )
        return machine
