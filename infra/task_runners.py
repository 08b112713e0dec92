"""What running tasks takes, in the Lambda executor and the Fargate worker alike: the variables
that configure the engine there, and the grants of its role.

The task runners reach only the partitions a running task touches (``TASK#`` and ``TENANT#``,
never ``APIKEY#`` or ``IDEMP#``) and delete nothing there; python_exec's code runs in the sandbox
function (infra/sandbox.py), which they may invoke and which may do nothing. One definition for
both, so the executor and the worker cannot drift apart (``tests/test_cdk_stack.py``).
"""

from __future__ import annotations

import json

from aws_cdk import aws_iam as iam
from aws_cdk import aws_stepfunctions as sfn

from agentq.control.defaults import Defaults
from agentq.core.providers.keys import OPENAI_SECRET_VARIABLE, SECRET_VARIABLE
from agentq.core.providers.openai_provider import BASE_URL_VARIABLE as OPENAI_BASE_URL_VARIABLE
from agentq.storage.keys import a2a_push_pk, task_pk, tenant_pk
from agentq.storage.workers import WORKERS_PK
from infra.access import (
    PAYLOAD_ACTIONS,
    SLOT_PARTITIONS,
    TABLE_ACTIONS,
    anthropic_secret_arn,
    bedrock_resources,
    event_bus_arn,
    event_bus_name,
    execution_arns,
    liveness_statements,
    payload_objects,
    secret_arn,
    table_resources,
    vault_statements,
)
from infra.data import Data
from infra.model_access import BEDROCK_ACTIONS
from infra.sandbox import Sandbox
from infra.settings import EnvironmentSettings

# A running task creates, reads and updates its own items, its tree's budget and its tenant's
# windows; deleting is the API's (an unstarted task) and the reaper's business.
RUNNER_TABLE_ACTIONS = [a for a in TABLE_ACTIONS if a != "dynamodb:DeleteItem"]
# core.engine._workspace.ROOT_VARIABLE (the CDK tests pin the two together) and the directory it
# names in the executor's and the worker's /tmp, the one writable place either has.
WORKSPACE_ROOT_VARIABLE = "AGENTQ_WORKSPACE_ROOT"
WORKSPACE_ROOT = "/tmp/agentq-workspaces"
# FLOW#: fleet flow control (storage/flow.py); SCHEDULES: a schedule's fire (storage/schedules.py);
# WORKERS: worker liveness (storage/workers.py: a claim reads a task's owner's, a worker keeps its own)
RUNNER_PARTITIONS = [task_pk("*"), tenant_pk("*"), "FLOW#*", "SCHEDULES", WORKERS_PK]
# SQS authorises the *Batch calls with the single-message action.
SEND_ACTIONS = ["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"]
HOLD_ACTIONS = ["sqs:ChangeMessageVisibility", "sqs:DeleteMessage"]
RECEIVE_ACTIONS = ["sqs:ReceiveMessage"]


def defaults_env(cfg: EnvironmentSettings) -> dict[str, str]:
    """budget_defaults and the workspace limits as the AGENTQ_DEFAULT_*, AGENTQ_FLEET_CAPACITY,
    AGENTQ_TIER_CAPACITY and AGENTQ_WORKSPACE_MAX_* variables ``agentq.control.defaults.Defaults`` reads."""
    limits = {"workspace_max_bytes": cfg.workspace.max_bytes, "workspace_max_files": cfg.workspace.max_files}
    tiers = cfg.budget_defaults.tier_capacity or {}  # AGENTQ_TIER_CAPACITY: high=12,normal=10,low=8
    tier_capacity = ",".join(f"{tier}={n}" for tier, n in tiers.items()) or None
    return Defaults.model_validate({**cfg.budget_defaults.model_dump(), **limits, "tier_capacity": tier_capacity}).env()


def task_runner_env(cfg: EnvironmentSettings, sandbox: Sandbox) -> dict[str, str]:
    """What running tasks needs besides the resource names, in the executor and the worker alike."""
    env = {
        "AGENTQ_TASK_RETENTION_DAYS": str(cfg.task_retention_days),
        # Where a task's workspace lives while a run holds it: Lambda's /tmp, the worker's task
        # volume at /tmp (core.engine._workspace); its content is in the bucket between runs.
        WORKSPACE_ROOT_VARIABLE: WORKSPACE_ROOT,
        **defaults_env(cfg),
        **sandbox.env(),
    }
    bus = event_bus_name(cfg)
    if bus:
        env["AGENTQ_EVENT_BUS"] = bus
    env["AGENTQ_BREAKER"] = cfg.flow.breaker.model_dump_json()
    if cfg.flow.limits:
        env["AGENTQ_RATE_LIMITS"] = json.dumps({k: v.model_dump(exclude_none=True) for k, v in cfg.flow.limits.items()})
    if cfg.anthropic_api_key_secret:
        env[SECRET_VARIABLE] = cfg.anthropic_api_key_secret
    if cfg.openai_api_key_secret:
        env[OPENAI_SECRET_VARIABLE] = cfg.openai_api_key_secret
    if cfg.openai_base_url:
        env[OPENAI_BASE_URL_VARIABLE] = cfg.openai_base_url
    return env


def user_code_env(cfg: EnvironmentSettings) -> dict[str, str]:
    """The variables that load your tools and grant their secrets (``user_code`` in cdk.json)."""
    user = cfg.user_code
    if user is None:
        return {}
    env = {"AGENTQ_TOOL_MODULES": ",".join(user.tool_modules)}
    if user.secrets:
        env.update({"AGENTQ_SECRET_NAMES": ",".join(user.secrets), "AGENTQ_SECRETS_BACKEND": "secretsmanager"})
    if user.mcp_servers:
        env["AGENTQ_MCP_SERVERS"] = json.dumps(user.mcp_servers, sort_keys=True)
    return env


def grant_task_runner(
    principal: iam.IGrantable,
    data: Data,
    machine: sfn.StateMachine,
    cfg: EnvironmentSettings,
    sandbox: Sandbox,
    *,
    receive: bool,
    invoke_sandbox: bool = True,
) -> None:
    """What running tasks takes (Lambda executor; with ``receive`` the Fargate worker, which
    polls itself): the task partitions of the table, payloads, sending to and holding messages
    of the tier queues, dead-lettering, the fan-out machine, Bedrock, agentq events, and
    invoking the sandbox function."""
    for statement in [
        *_data_statements(data, receive=receive),
        *vault_statements(data, seal=False),
        iam.PolicyStatement(sid="Bedrock", actions=BEDROCK_ACTIONS, resources=bedrock_resources(cfg)),
        # a long-running worker keeps its liveness item and recovers dead peers' tasks
        *(liveness_statements(data) if receive else []),
        *_secret_statements(cfg),
        *_events_statements(cfg),
        *_fanout_statements(cfg, machine),
    ]:
        principal.grant_principal.add_to_principal_policy(statement)
    if invoke_sandbox:  # not the EC2 workspace tier, whose python_exec runs in bubblewrap on its host
        sandbox.grant_invoke(principal)


def _data_statements(data: Data, *, receive: bool) -> list[iam.PolicyStatement]:
    """The table, the payloads and the queues (a worker, ``receive``, also polls them)."""
    queues = [q.queue_arn for q in data.queues.values()]
    dlqs = [q.queue_arn for q in data.dlqs.values()]
    return [
        iam.PolicyStatement(
            sid="Table",
            actions=RUNNER_TABLE_ACTIONS,
            resources=table_resources(data, indexes=False),
            # Every item of a request (each of a transaction or batch) must be in one of these.
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": RUNNER_PARTITIONS}},
        ),
        iam.PolicyStatement(
            sid="RunningSlots",
            actions=TABLE_ACTIONS,
            resources=table_resources(data, indexes=False),
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": SLOT_PARTITIONS}},
        ),
        # A task's A2A push configs (storage/a2a_push.py), read when it pauses or ends to queue
        # its notifications (queueing/a2a_push.py): read only; the API writes them.
        iam.PolicyStatement(
            sid="A2APushConfigs",
            actions=["dynamodb:Query"],
            resources=[data.table.table_arn],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [a2a_push_pk("*")]}},
        ),
        iam.PolicyStatement(sid="Payloads", actions=PAYLOAD_ACTIONS, resources=[payload_objects(data)]),
        iam.PolicyStatement(
            sid="SendToQueues", actions=SEND_ACTIONS, resources=[*queues, *dlqs, data.webhooks.queue_arn]
        ),
        iam.PolicyStatement(
            sid="HoldMessages", actions=HOLD_ACTIONS + (RECEIVE_ACTIONS if receive else []), resources=queues
        ),
    ]


def _secret_statements(cfg: EnvironmentSettings) -> list[iam.PolicyStatement]:
    """The model keys' named secrets, where the settings name them."""
    statements = []
    if cfg.anthropic_api_key_secret:
        statements.append(
            iam.PolicyStatement(
                sid="AnthropicApiKey", actions=["secretsmanager:GetSecretValue"], resources=[anthropic_secret_arn(cfg)]
            )
        )
    if cfg.openai_api_key_secret:
        statements.append(
            iam.PolicyStatement(
                sid="OpenAIApiKey",
                actions=["secretsmanager:GetSecretValue"],
                resources=[secret_arn(cfg.openai_api_key_secret)],
            )
        )
    return statements


def _events_statements(cfg: EnvironmentSettings) -> list[iam.PolicyStatement]:
    bus = event_bus_arn(cfg)
    return [iam.PolicyStatement(sid="Events", actions=["events:PutEvents"], resources=[bus])] if bus else []


def _fanout_statements(cfg: EnvironmentSettings, machine: sfn.StateMachine) -> list[iam.PolicyStatement]:
    """Starting a fan-out, stopping one (a cancel), and a child's report to its parent's execution."""
    return [
        iam.PolicyStatement(
            sid="StartFanout", actions=["states:StartExecution"], resources=[machine.state_machine_arn]
        ),
        iam.PolicyStatement(sid="StopFanout", actions=["states:StopExecution"], resources=[execution_arns(cfg)]),
        iam.PolicyStatement(
            sid="ReportChild",
            actions=["states:SendTaskSuccess", "states:SendTaskFailure"],
            resources=[machine.state_machine_arn],
        ),
    ]


def grant_user_code(principal: iam.IGrantable, cfg: EnvironmentSettings, *, runs_tools: bool) -> None:
    """Reading the granted secrets; for what runs tools, also the statements the tools need."""
    user = cfg.user_code
    if user is None:
        return
    statements = []
    if user.secrets:
        statements.append(
            iam.PolicyStatement(
                sid="UserCodeSecrets",
                actions=["secretsmanager:GetSecretValue"],
                resources=[secret_arn(name) for name in user.secrets],
            )
        )
    if runs_tools:
        for i, extra in enumerate(user.iam_statements):
            statements.append(
                iam.PolicyStatement(sid=extra.sid or f"UserCode{i}", actions=extra.actions, resources=extra.resources)
            )
    for statement in statements:
        principal.grant_principal.add_to_principal_policy(statement)
