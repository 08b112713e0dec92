"""The fan-out state machine, from the one ASL document the local stack runs too
(``agentq/asl/fanout.asl.json``): a Map over ``sqs:sendMessage.waitForTaskToken`` (one message a
child), then a wake message for the parent. Standard type, X-Ray on, its log at ALL without
execution data (goals and results stay out of logs)."""

from __future__ import annotations

import json

from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.resources import fanout_definition
from infra.data import Data
from infra.retention import log_retention, removal_policy
from infra.settings import EnvironmentSettings


def build_fanout(scope: Construct, cfg: EnvironmentSettings, data: Data) -> sfn.StateMachine:
    """Its queue URLs come from the execution input, so its role is granted the tier queues here
    (and the EC2 workspace tier's, by infra/workspace_tier.py)."""
    log_group = logs.LogGroup(
        scope,
        "FanoutLogs",
        log_group_name=f"/aws/vendedlogs/states/{cfg.names.state_machine}",
        retention=log_retention(cfg.log_retention_days),
        removal_policy=removal_policy(cfg),
    )
    machine = sfn.StateMachine(
        scope,
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
