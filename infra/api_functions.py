"""The functions behind the REST API (``infra/api.py``): the API itself, the EventBridge Scheduler
its schedules are created in, and the TOKEN authorizer.

The API reads and writes the whole table (it submits, lists, cancels, deletes an unstarted task),
the payloads, enqueues to the tier queues and the webhooks queue, reads and redrives a tenant's
dead letters, creates the tenant schedules in this environment's group, and stops a cancelled
parent's fan-out. The authorizer reads API keys and nothing else.
"""

from __future__ import annotations

import json

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from constructs import Construct

from agentq.api.oidc import OIDC_ENV
from agentq.observe.names import NAMESPACE as METRICS_NAMESPACE
from agentq.storage.keys import api_key_key
from infra.access import (
    PAYLOAD_ACTIONS,
    TABLE_ACTIONS,
    event_bus_arn,
    event_bus_name,
    execution_arns,
    payload_objects,
    table_resources,
    vault_env,
    vault_statements,
)
from infra.data import Data
from infra.functions import FunctionFactory
from infra.retention import removal_policy
from infra.settings import EnvironmentSettings
from infra.task_runners import grant_user_code, user_code_env

# GET /dead-letters and POST /dead-letters/{tier}/redrive (agentq.api.routes.dead_letters): a tenant's
# dead letters are read and moved back from the DLQs (sent with Enqueue), one by one; the queue's
# counts tell either one that another holds messages for a moment (agentq.queueing.dlq).
DEAD_LETTER_ACTIONS = [
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueUrl",
    "sqs:GetQueueAttributes",
]


def build_api_function(
    scope: Construct, function: FunctionFactory, cfg: EnvironmentSettings, data: Data, common: dict[str, str]
) -> lambda_.Function:
    api = function(
        "api",
        memory=cfg.api.memory_mb,
        timeout=cfg.api.timeout_seconds,
        env=api_env(cfg, data, common),
        reserved=cfg.api.reserved_concurrency,
        description="agentq HTTP API (API Gateway REST proxy)",
        extra_layers=function.layers.tools,
    )
    grant_user_code(api, cfg, runs_tools=False)
    queue_arns = [q.queue_arn for q in data.queues.values()]
    for statement in (
        iam.PolicyStatement(sid="Table", actions=TABLE_ACTIONS, resources=table_resources(data, indexes=True)),
        iam.PolicyStatement(sid="Payloads", actions=PAYLOAD_ACTIONS, resources=[payload_objects(data)]),
        iam.PolicyStatement(
            sid="Enqueue",
            actions=["sqs:SendMessage", "sqs:GetQueueUrl"],
            resources=[*queue_arns, data.webhooks.queue_arn],  # a cancel queues the task's callback
        ),
        iam.PolicyStatement(
            sid="DeadLetters", actions=DEAD_LETTER_ACTIONS, resources=[q.queue_arn for q in data.dlqs.values()]
        ),
        *vault_statements(data, seal=True)[1:],  # the table: its own statement covers every partition
    ):
        api.add_to_role_policy(statement)
    if (bus_arn := event_bus_arn(cfg)) is not None:
        api.add_to_role_policy(iam.PolicyStatement(sid="Events", actions=["events:PutEvents"], resources=[bus_arn]))
    _schedules(scope, cfg, data, api)
    # Cancelling a waiting parent stops its fan-out execution.
    api.add_to_role_policy(
        iam.PolicyStatement(sid="StopFanout", actions=["states:StopExecution"], resources=[execution_arns(cfg)])
    )
    return api


def api_env(cfg: EnvironmentSettings, data: Data, common: dict[str, str]) -> dict[str, str]:
    """The API's environment (the A2A streaming function's too, ``infra/a2a.py``): it validates
    tool names and lists MCP servers' tools; its status changes go to the bus too."""
    return {
        **common,
        **user_code_env(cfg),
        **vault_env(data),
        **({"AGENTQ_EVENT_BUS": bus} if (bus := event_bus_name(cfg)) else {}),
    }


def _schedules(scope: Construct, cfg: EnvironmentSettings, data: Data, api: lambda_.Function) -> iam.Role:
    """EventBridge Scheduler for ``POST /schedules``: a schedule group of this environment, and
    the role its schedules send with, which may only send to the normal tier queue (the fire
    message; the executor that receives it submits the task). The API may create, update and
    delete schedules in that group only, and pass that role only, to the Scheduler only."""
    group = scheduler.CfnScheduleGroup(scope, "ScheduleGroup", name=schedule_group_name(cfg))
    # It holds the tenants' schedules (made at run time): deleting it deletes them, while a
    # retained table still lists them. Kept as the environment keeps its data.
    group.apply_removal_policy(removal_policy(cfg))
    role = iam.Role(
        scope, "SchedulerRole", role_name=f"{cfg.prefix}-scheduler",
        assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com", conditions={
            "StringEquals": {"aws:SourceAccount": cdk.Aws.ACCOUNT_ID}}),
        description=f"agentq schedules ({cfg.prefix}): send a fire message to the normal tier queue",
    )  # fmt: skip
    data.queues["normal"].grant_send_messages(role)
    # A fire the Scheduler cannot send after its retries (a throttle, a deleted queue, a key or
    # a policy change) goes to the normal tier's DLQ (its alarm, its runbook: a redriven fire
    # message fires again, coalesced) instead of being dropped without a trace. The Scheduler
    # sends it with this role; the queue is SSE-SQS encrypted, so no key grant is needed.
    fire_dlq = data.dlqs["normal"]
    fire_dlq.grant_send_messages(role)
    schedules = f"arn:{cdk.Aws.PARTITION}:scheduler:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}:schedule/{group.name}/*"
    api.add_to_role_policy(
        iam.PolicyStatement(
            sid="Schedules",
            actions=["scheduler:CreateSchedule", "scheduler:UpdateSchedule", "scheduler:DeleteSchedule"],
            resources=[schedules],
        )
    )
    api.add_to_role_policy(
        iam.PolicyStatement(
            sid="PassSchedulerRole", actions=["iam:PassRole"], resources=[role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}},
        )
    )  # fmt: skip
    api.add_environment("AGENTQ_SCHEDULER_GROUP", str(group.name))
    api.add_environment("AGENTQ_SCHEDULER_ROLE_ARN", role.role_arn)
    api.add_environment("AGENTQ_SCHEDULE_TARGET_ARN", data.queues["normal"].queue_arn)
    api.add_environment("AGENTQ_SCHEDULE_DLQ_ARN", fire_dlq.queue_arn)  # control.schedules: Target.DeadLetterConfig
    return role


def schedule_group_name(cfg: EnvironmentSettings) -> str:
    """The tenants' schedules' group; AWS/Scheduler reports their fires by it (infra/alarms.py)."""
    return f"{cfg.prefix}-schedules"


def build_authorizer(function: FunctionFactory, cfg: EnvironmentSettings, data: Data) -> lambda_.Function:
    """The TOKEN authorizer: a bearer key's SHA-256 looked up in the table (``agentq.api.auth``),
    and with cdk.json's ``oidc`` a JWT of that issuer (``agentq.api.oidc``: its JWKS fetched over
    HTTPS from the function, which runs outside any VPC)."""
    authorizer = function(
        "authorizer",
        memory=256,
        timeout=10,
        env={
            "AGENTQ_PREFIX": cfg.names.prefix,
            "AGENTQ_TABLE": data.table.table_name,
            "POWERTOOLS_LOG_LEVEL": cfg.log_level,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        },
        reserved=None,
        description="agentq API key authorizer (Bearer key -> tenant; Bearer JWT -> tenant and user)",
    )
    if cfg.oidc is not None:  # read by agentq.api.oidc.OidcSettings.from_env
        authorizer.add_environment(OIDC_ENV, json.dumps(cfg.oidc.model_dump(exclude_none=True)))
    # Only the API keys' partitions (``APIKEY#<sha256>``, storage/keys.py): the function that
    # parses every caller's token must not be able to read a tenant's tasks, vault or secrets.
    # An issuer's JWKS is cached in the function's memory (api/oidc.py), never in the table.
    authorizer.add_to_role_policy(
        iam.PolicyStatement(
            sid="ApiKeys",
            actions=["dynamodb:GetItem"],
            resources=[data.table.table_arn],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [api_key_key("*")["pk"]]}},
        )
    )
    return authorizer
