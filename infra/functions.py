"""The Lambda layers, the functions, and what each may do (least privilege).

Each function gets its own role with only the actions its code path calls, on this
deployment's resources (no ``*`` except X-Ray's, which AWS requires). The handlers in
``functions/`` ship as one small asset; each function runs its own module from it. The task
runners (executor, worker) reach only the partitions a running task touches (``TASK#``
and ``TENANT#``: never ``APIKEY#`` or ``IDEMP#``) and delete nothing; python_exec's
code runs in the sandbox function (infra/sandbox.py), which they may invoke and which may
do nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.control.defaults import Defaults
from agentq.control.retention import ttl_removal_pattern
from agentq.core.providers.keys import OPENAI_SECRET_VARIABLE, SECRET_VARIABLE
from agentq.core.providers.openai_provider import BASE_URL_VARIABLE as OPENAI_BASE_URL_VARIABLE
from agentq.observe.names import NAMESPACE as METRICS_NAMESPACE
from agentq.resources import GSI_LIVE, GSI_OWNER, PAYLOAD_PREFIX, TIERS
from agentq.storage.keys import task_pk, tenant_pk
from agentq.storage.workers import WORKERS_PK
from infra.build_layers import CORE_LAYER_DIR, DepsLayer
from infra.data import Data
from infra.events import ADAPTER_ENV, STREAM_TIMEOUT_SECONDS, adapter_layer
from infra.model_access import BEDROCK_ACTIONS, bedrock_resource_templates
from infra.sandbox import Sandbox, build_sandbox
from infra.settings import EnvironmentSettings
from infra.telemetry import lambda_collector, otel_env

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS_DIR = ROOT / "functions"
HANDLERS = {
    "executor": "executor.handler.lambda_handler",
    "api": "api.handler.lambda_handler",
    "authorizer": "authorizer.handler.lambda_handler",
    "reaper": "reaper.handler.lambda_handler",
    "sweeper": "sweeper.handler.lambda_handler",
    "webhooks": "webhooks.handler.lambda_handler",
    "events": "events/run.sh",  # the startup script the Lambda Web Adapter runs (infra/events.py)
}
RUNTIME = lambda_.Runtime.PYTHON_3_12  # the layers are built for cp312 (infra/build_layers.py)
ASSET_EXCLUDES = ["**/__pycache__", "**/*.pyc", "*.egg-info", "README.md"]

# What the table's users call. TransactWriteItems is authorised per item as Put/Update/Delete/
# ConditionCheckItem; BatchGetItem as GetItem on each table, but IAM lists it on its own.
TABLE_ACTIONS = [
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
]
# A running task creates, reads and updates its own items, its tree's budget and its tenant's
# windows; deleting is the API's (an unstarted task) and the reaper's business.
RUNNER_TABLE_ACTIONS = [a for a in TABLE_ACTIONS if a != "dynamodb:DeleteItem"]
# FLOW#: fleet flow control (storage/flow.py); SCHEDULES: a schedule's fire (storage/schedules.py);
# WORKERS: worker liveness (storage/workers.py: a claim reads a task's owner's, a worker keeps its own)
RUNNER_PARTITIONS = [task_pk("*"), tenant_pk("*"), "FLOW#*", "SCHEDULES", WORKERS_PK]
# The running limits (storage/running_slots.py): admitting takes a slot item and a HOLD# item in
# the tenant's and a concurrency key's partitions; releasing deletes the HOLD# item, parking puts
# a WAIT# item and waking deletes it; the fleet's shards, lists and waiting tenants are under
# FLEET# (storage/fleet_slots.py). DeleteItem reaches no further than those partitions.
SLOT_PARTITIONS = [tenant_pk("*"), "CKEY#*", "FLEET*"]
PAYLOAD_ACTIONS = ["s3:GetObject", "s3:PutObject"]
# SQS authorises the *Batch calls with the single-message action.
SEND_ACTIONS = ["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"]
HOLD_ACTIONS = ["sqs:ChangeMessageVisibility", "sqs:DeleteMessage"]
RECEIVE_ACTIONS = ["sqs:ReceiveMessage"]


@dataclass
class Functions:
    executor: lambda_.Function
    api: lambda_.Function
    authorizer: lambda_.Function
    reaper: lambda_.Function
    reaper_dlq: sqs.Queue  # stream batches the reaper gave up on (their shard and sequence range)
    sweeper: lambda_.Function
    webhooks: lambda_.Function
    events: lambda_.Function  # GET /tasks/{id}/events, streamed (infra/events.py)
    sandbox: Sandbox
    core_layer: lambda_.LayerVersion
    deps_layer: lambda_.LayerVersion
    log_groups: dict[str, logs.LogGroup]


def log_retention(days: int) -> logs.RetentionDays:
    return getattr(  # type: ignore[no-any-return]
        logs.RetentionDays,
        {
            1: "ONE_DAY", 3: "THREE_DAYS", 5: "FIVE_DAYS", 7: "ONE_WEEK", 14: "TWO_WEEKS", 30: "ONE_MONTH",
            60: "TWO_MONTHS", 90: "THREE_MONTHS", 120: "FOUR_MONTHS", 150: "FIVE_MONTHS", 180: "SIX_MONTHS",
            365: "ONE_YEAR", 400: "THIRTEEN_MONTHS", 545: "EIGHTEEN_MONTHS", 731: "TWO_YEARS",
            1096: "THREE_YEARS", 1827: "FIVE_YEARS", 2192: "SIX_YEARS", 2557: "SEVEN_YEARS",
            2922: "EIGHT_YEARS", 3288: "NINE_YEARS", 3653: "TEN_YEARS",
        }[days],
    )  # fmt: skip


def _architecture(cfg: EnvironmentSettings) -> lambda_.Architecture:
    return lambda_.Architecture.ARM_64 if cfg.architecture == "arm64" else lambda_.Architecture.X86_64


def table_resources(data: Data, *, indexes: bool) -> list[str]:
    arns = [data.table.table_arn]
    if indexes:
        arns += [f"{data.table.table_arn}/index/{name}" for name in data.gsi_names]
    return arns


def payload_objects(data: Data) -> str:
    return data.payloads.arn_for_objects(f"{PAYLOAD_PREFIX}*")


# The reaper deletes a finished task's items (Query its partition, BatchWriteItem deletes, and
# DeleteItem for META and the budget) and its payload objects (listed by prefix).
REAPER_TABLE_ACTIONS = ["dynamodb:Query", "dynamodb:BatchWriteItem", "dynamodb:DeleteItem"]
REAPER_PAYLOAD_ACTIONS = ["s3:DeleteObject"]


def bedrock_resources(cfg: EnvironmentSettings) -> list[str]:
    """The Bedrock models ``bedrock_models`` names (infra/model_access.py)."""
    aws = cdk.Aws
    return [
        t.format(partition=aws.PARTITION, region=aws.REGION, account=aws.ACCOUNT_ID)
        for t in bedrock_resource_templates(cfg.bedrock_models)
    ]


def execution_arns(cfg: EnvironmentSettings) -> str:
    """Executions of this environment's fan-out machine, by its fixed name."""
    return f"arn:{cdk.Aws.PARTITION}:states:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}:execution:{cfg.names.state_machine}:*"


def event_bus_name(cfg: EnvironmentSettings) -> str | None:
    """``stack``: the bus the stack creates (``{prefix}-events``); another name: that bus; None: none."""
    if not cfg.event_bus:
        return None
    return f"{cfg.prefix}-events" if cfg.event_bus == "stack" else cfg.event_bus


def event_bus_arn(cfg: EnvironmentSettings) -> str | None:
    name = event_bus_name(cfg)
    if name is None:
        return None
    return f"arn:{cdk.Aws.PARTITION}:events:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}:event-bus/{name}"


def anthropic_secret_arn(cfg: EnvironmentSettings) -> str:
    """The named secret: Secrets Manager appends six random characters to a secret's ARN."""
    return secret_arn(str(cfg.anthropic_api_key_secret))


def task_runner_env(cfg: EnvironmentSettings, sandbox: Sandbox) -> dict[str, str]:
    """What running tasks needs besides the resource names, in the executor and the worker alike."""
    env = {
        "AGENTQ_TASK_RETENTION_DAYS": str(cfg.task_retention_days),
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


def defaults_env(cfg: EnvironmentSettings) -> dict[str, str]:
    """budget_defaults as the AGENTQ_DEFAULT_* variables ``agentq.control.defaults.Defaults`` reads."""
    return Defaults.model_validate(cfg.budget_defaults.model_dump()).env()


def _liveness_statements(data: Data) -> list[iam.PolicyStatement]:
    """Worker liveness (``storage.workers``, ``queueing.recovery``): the ``WORKERS`` partition
    (its items are removed when a worker stops or its recovery ends) and the ``owner`` index
    that lists a dead worker's tasks."""
    table = data.table.table_arn
    return [
        iam.PolicyStatement(
            sid="WorkerLiveness",
            actions=[
                "dynamodb:Query",
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
            ],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [WORKERS_PK]}},
        ),
        iam.PolicyStatement(sid="OwnerIndex", actions=["dynamodb:Query"], resources=[f"{table}/index/{GSI_OWNER}"]),
    ]


def grant_task_runner(
    principal: iam.IGrantable,
    data: Data,
    machine: sfn.StateMachine,
    cfg: EnvironmentSettings,
    sandbox: Sandbox,
    *,
    receive: bool,
) -> None:
    """What running tasks takes (Lambda executor; with ``receive`` the Fargate worker, which
    polls itself): the task partitions of the table, payloads, sending to and holding messages
    of the tier queues, dead-lettering, the fan-out machine, Bedrock, agentq events, and
    invoking the sandbox function."""
    queues = [q.queue_arn for q in data.queues.values()]
    dlqs = [q.queue_arn for q in data.dlqs.values()]
    statements = [
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
        iam.PolicyStatement(sid="Payloads", actions=PAYLOAD_ACTIONS, resources=[payload_objects(data)]),
        iam.PolicyStatement(
            sid="SendToQueues", actions=SEND_ACTIONS, resources=[*queues, *dlqs, data.webhooks.queue_arn]
        ),
        iam.PolicyStatement(
            sid="HoldMessages", actions=HOLD_ACTIONS + (RECEIVE_ACTIONS if receive else []), resources=queues
        ),
        iam.PolicyStatement(sid="Bedrock", actions=BEDROCK_ACTIONS, resources=bedrock_resources(cfg)),
    ]
    if receive:  # a long-running worker keeps its liveness item and recovers dead peers' tasks
        statements += _liveness_statements(data)
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
    bus = event_bus_arn(cfg)
    if bus:
        statements.append(iam.PolicyStatement(sid="Events", actions=["events:PutEvents"], resources=[bus]))
    statements += [
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
    for statement in statements:
        principal.grant_principal.add_to_principal_policy(statement)
    sandbox.grant_invoke(principal)


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


def secret_arn(name: str) -> str:
    """A named secret's ARN: Secrets Manager appends six random characters."""
    return f"arn:{cdk.Aws.PARTITION}:secretsmanager:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}:secret:{name}-??????"


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


def _role(scope: Construct, name: str, log_group: logs.LogGroup, description: str) -> iam.Role:
    """A function role that may write its own log group and nothing else (yet)."""
    role = iam.Role(
        scope, f"{name}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=description
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="OwnLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group.log_group_arn]
        )
    )
    return role


def build_functions(
    scope: Construct,
    env_name: str,
    cfg: EnvironmentSettings,
    data: Data,
    machine: sfn.StateMachine,
    deps: DepsLayer,
    user_layer: DepsLayer | None = None,
) -> Functions:
    removal = cdk.RemovalPolicy.DESTROY if cfg.destroy else cdk.RemovalPolicy.RETAIN
    arch = _architecture(cfg)
    names = cfg.names
    core_layer = lambda_.LayerVersion(
        scope,
        "CoreLayer",
        code=lambda_.Code.from_asset(str(CORE_LAYER_DIR), exclude=ASSET_EXCLUDES),
        compatible_runtimes=[RUNTIME],
        compatible_architectures=[arch],
        description="agentq core library (layers/agentq/python)",
    )
    deps_layer = lambda_.LayerVersion(
        scope,
        "DepsLayer",
        code=lambda_.Code.from_asset(str(deps.path), exclude=[".agentq-layer-complete"]),
        compatible_runtimes=[RUNTIME],
        compatible_architectures=[arch],
        description="agentq third-party dependencies (layers/requirements.txt, manylinux wheels)",
    )
    user_code_layer = (
        lambda_.LayerVersion(
            scope,
            "UserCodeLayer",
            code=lambda_.Code.from_asset(str(user_layer.path), exclude=[".agentq-layer-complete"]),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[arch],
            description="your tools (user_code.package_dir and its requirements)",
        )
        if user_layer is not None
        else None
    )
    tool_layers: list[lambda_.ILayerVersion] = [user_code_layer] if user_code_layer is not None else []
    code = lambda_.Code.from_asset(str(FUNCTIONS_DIR), exclude=ASSET_EXCLUDES)
    sandbox = build_sandbox(
        scope,
        cfg,
        code=code,
        core_layer=core_layer,
        runtime=RUNTIME,
        architecture=arch,
        retention=log_retention(cfg.log_retention_days),
    )

    common = {
        "AGENTQ_ENV": env_name,
        "AGENTQ_PREFIX": names.prefix,
        "AGENTQ_TABLE": data.table.table_name,
        "AGENTQ_BUCKET": data.payloads.bucket_name,
        "AGENTQ_STATE_MACHINE_ARN": machine.state_machine_arn,
        "AGENTQ_TASK_RETENTION_DAYS": str(cfg.task_retention_days),
        **defaults_env(cfg),
        "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        "POWERTOOLS_LOG_LEVEL": cfg.log_level,
        # LLM responses can be large; X-Ray segments cap at 64 KB. Spans keep the GenAI
        # attributes (model, tokens, stop reason) the code adds, not whole payloads.
        "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
    }

    log_groups: dict[str, logs.LogGroup] = {}

    def function(
        name: str,
        *,
        memory: int,
        timeout: int,
        env: dict[str, str],
        reserved: int | None,
        description: str,
        extra_layers: list[lambda_.ILayerVersion] | None = None,
    ) -> lambda_.Function:
        log_group = logs.LogGroup(
            scope,
            f"{name.capitalize()}FunctionLogs",
            retention=log_retention(cfg.log_retention_days),
            removal_policy=removal,
        )
        log_groups[name] = log_group
        return lambda_.Function(
            scope,
            f"{name.capitalize()}Function",
            function_name=f"{names.prefix}-{name}",
            description=description,
            runtime=RUNTIME,
            architecture=arch,
            code=code,
            handler=HANDLERS[name],
            layers=[core_layer, deps_layer, *(extra_layers or [])],
            memory_size=memory,
            timeout=cdk.Duration.seconds(timeout),
            reserved_concurrent_executions=reserved,
            environment={**env, "POWERTOOLS_SERVICE_NAME": f"agentq-{name}"},
            tracing=lambda_.Tracing.ACTIVE,
            log_group=log_group,
            role=_role(scope, f"{name.capitalize()}Function", log_group, f"agentq {name} ({names.prefix})"),
        )

    collector_layers, collector_env = lambda_collector(scope, cfg)  # tracing.exporter = "adot" only
    ex = cfg.executor
    executor_env = {
        **common,
        "AGENTQ_SLICE_MARGIN_SECONDS": str(ex.slice_margin_seconds),
        "AGENTQ_VISIBILITY_SECONDS": str(ex.visibility_seconds),
        "AGENTQ_LEASE_SECONDS": str(ex.lease_seconds),
        "AGENTQ_MAX_RECEIVE_COUNT": str(cfg.max_receive_count),
        **task_runner_env(cfg, sandbox),
        **user_code_env(cfg),
        **collector_env,
        **otel_env(cfg, "agentq-executor"),
    }
    executor = function(
        "executor",
        memory=ex.memory_mb,
        timeout=ex.timeout_seconds,
        env=executor_env,
        reserved=ex.reserved_concurrency,
        description="agentq executor: runs a task for one time slice per SQS message",
        extra_layers=[*tool_layers, *collector_layers],
    )
    grant_task_runner(executor, data, machine, cfg, sandbox, receive=False)
    grant_user_code(executor, cfg, runs_tools=True)
    for tier in TIERS:
        # Batch size 1: a message is a task slice; a failed one comes back alone.
        executor.add_event_source(
            sources.SqsEventSource(
                data.queues[tier],
                batch_size=1,
                report_batch_item_failures=True,
                max_concurrency=ex.tier_max_concurrency[tier],
            )
        )

    api = function(
        "api",
        memory=cfg.api.memory_mb,
        timeout=cfg.api.timeout_seconds,
        # it validates tool names and lists MCP servers' tools; its status changes go to the bus too
        env={**common, **user_code_env(cfg), **({"AGENTQ_EVENT_BUS": bus} if (bus := event_bus_name(cfg)) else {})},
        reserved=cfg.api.reserved_concurrency,
        description="agentq HTTP API (API Gateway REST proxy)",
        extra_layers=tool_layers,
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
    ):
        api.add_to_role_policy(statement)
    # GET /dead-letters and POST /dead-letters/{tier}/redrive (agentq.api.routes.dead_letters): a tenant's
    # dead letters are read and moved back from the DLQs (sent with Enqueue above), one by one; the
    # queue's counts tell either one that another holds messages for a moment (agentq.queueing.dlq).
    api.add_to_role_policy(
        iam.PolicyStatement(
            sid="DeadLetters",
            actions=[
                "sqs:ReceiveMessage",
                "sqs:DeleteMessage",
                "sqs:ChangeMessageVisibility",
                "sqs:GetQueueUrl",
                "sqs:GetQueueAttributes",
            ],
            resources=[q.queue_arn for q in data.dlqs.values()],
        )
    )
    if (bus_arn := event_bus_arn(cfg)) is not None:
        api.add_to_role_policy(iam.PolicyStatement(sid="Events", actions=["events:PutEvents"], resources=[bus_arn]))
    _schedules(scope, cfg, data, api)
    # Cancelling a waiting parent stops its fan-out execution.
    api.add_to_role_policy(
        iam.PolicyStatement(sid="StopFanout", actions=["states:StopExecution"], resources=[execution_arns(cfg)])
    )

    authorizer = function(
        "authorizer",
        memory=256,
        timeout=10,
        env={
            "AGENTQ_PREFIX": names.prefix,
            "AGENTQ_TABLE": data.table.table_name,
            "POWERTOOLS_LOG_LEVEL": cfg.log_level,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        },
        reserved=None,
        description="agentq API key authorizer (Bearer key -> tenant)",
    )
    authorizer.add_to_role_policy(
        iam.PolicyStatement(sid="ApiKeys", actions=["dynamodb:GetItem"], resources=[data.table.table_arn])
    )
    reaper, reaper_dlq = _reaper(scope, cfg, data, function, removal)
    sweeper = _sweeper(scope, cfg, data, function)
    webhooks = _webhooks(cfg, data, function, common)
    streams = function(
        "events",
        memory=512,
        timeout=STREAM_TIMEOUT_SECONDS,
        env={**common, **ADAPTER_ENV},
        reserved=None,
        description="agentq task event streams (GET /tasks/{id}/events) behind the Lambda Web Adapter",
        extra_layers=[adapter_layer(scope, arch)],
    )
    # It reads a task's META, its log (steps, events, claims) and offloaded step bodies; nothing else.
    streams.add_to_role_policy(
        iam.PolicyStatement(sid="Table", actions=["dynamodb:GetItem", "dynamodb:Query"],
                            resources=table_resources(data, indexes=False))
    )  # fmt: skip
    streams.add_to_role_policy(
        iam.PolicyStatement(sid="Payloads", actions=["s3:GetObject"], resources=[payload_objects(data)])
    )
    return Functions(
        executor,
        api,
        authorizer,
        reaper,
        reaper_dlq,
        sweeper,
        webhooks,
        streams,
        sandbox,
        core_layer,
        deps_layer,
        log_groups,
    )


def _schedules(scope: Construct, cfg: EnvironmentSettings, data: Data, api: lambda_.Function) -> iam.Role:
    """EventBridge Scheduler for ``POST /schedules``: a schedule group of this environment, and
    the role its schedules send with, which may only send to the normal tier queue (the fire
    message; the executor that receives it submits the task). The API may create, update and
    delete schedules in that group only, and pass that role only, to the Scheduler only."""
    group = scheduler.CfnScheduleGroup(scope, "ScheduleGroup", name=f"{cfg.prefix}-schedules")
    role = iam.Role(
        scope, "SchedulerRole", role_name=f"{cfg.prefix}-scheduler",
        assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com", conditions={
            "StringEquals": {"aws:SourceAccount": cdk.Aws.ACCOUNT_ID}}),
        description=f"agentq schedules ({cfg.prefix}): send a fire message to the normal tier queue",
    )  # fmt: skip
    data.queues["normal"].grant_send_messages(role)
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
    return role


def _webhooks(
    cfg: EnvironmentSettings, data: Data, function: Callable[..., lambda_.Function], common: dict[str, str]
) -> lambda_.Function:
    """The deliverer of callbacks, on the webhooks queue (10 a batch, partial failures): it reads
    the tenant's signing secret (made on first use), POSTs, sets a retry's backoff, and sends a
    refused callback to the webhooks DLQ with its reason."""
    deliverer = function(
        "webhooks",
        memory=256,
        timeout=20,
        env=common,
        reserved=None,
        description="agentq webhooks: POSTs signed task-end callbacks",
    )
    deliverer.add_event_source(sources.SqsEventSource(data.webhooks, batch_size=10, report_batch_item_failures=True))
    for statement in (
        iam.PolicyStatement(
            sid="Secrets",
            actions=["dynamodb:GetItem", "dynamodb:PutItem"],
            resources=[data.table.table_arn],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [tenant_pk("*")]}},
        ),
        iam.PolicyStatement(
            sid="Backoff",
            actions=["sqs:ChangeMessageVisibility", "sqs:GetQueueUrl"],
            resources=[data.webhooks.queue_arn],
        ),
        iam.PolicyStatement(
            sid="DeadLetter", actions=["sqs:SendMessage", "sqs:GetQueueUrl"], resources=[data.webhooks_dlq.queue_arn]
        ),
    ):
        deliverer.add_to_role_policy(statement)
    return deliverer


def _sweeper(
    scope: Construct, cfg: EnvironmentSettings, data: Data, function: Callable[..., lambda_.Function]
) -> lambda_.Function:
    """The sweeper on a schedule: it lists unfinished tasks from the sparse ``live`` index,
    reads their META, re-enqueues the stranded ones and takes ended ones out of the index."""
    names, sc = cfg.names, cfg.sweeper
    sweeper = function(
        "sweeper",
        memory=sc.memory_mb,
        timeout=sc.timeout_seconds,
        env={
            "AGENTQ_PREFIX": names.prefix,
            "AGENTQ_TABLE": data.table.table_name,
            "AGENTQ_BUCKET": data.payloads.bucket_name,
            "AGENTQ_SWEEP_STALE_AFTER_SECONDS": str(sc.stale_after_seconds),
            **defaults_env(cfg),  # the default running limit: it wakes waiters a raised default has room for
            "AGENTQ_EMF": "1",
            "POWERTOOLS_LOG_LEVEL": cfg.log_level,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        },
        reserved=1,  # one sweep at a time: two would only send duplicates
        description="agentq sweeper: re-enqueues unfinished tasks left with no worker and no message",
    )
    table = data.table.table_arn
    for statement in (
        iam.PolicyStatement(sid="ListLive", actions=["dynamodb:Query"], resources=[f"{table}/index/{GSI_LIVE}"]),
        # META of the listed tasks (and their submissions, for the tier), and taking an ended
        # task out of the index; only task partitions.
        iam.PolicyStatement(
            sid="ReadTasks",
            actions=["dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:UpdateItem"],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [task_pk("*")]}},
        ),
        # The waiting lists of the running limits (storage/running_slots.py): a task parked
        # for a slot is left alone, so the sweeper reads whether it has a WAIT item; and it
        # wakes (deletes the WAIT item of) the waiters a tenant's slot item has room for.
        iam.PolicyStatement(
            sid="WaitingLists",
            actions=["dynamodb:Query", "dynamodb:GetItem", "dynamodb:DeleteItem"],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": SLOT_PARTITIONS}},
        ),
        # The fleet's wake (storage/fleet_slots.py): the shards and the waiting tenants' slot
        # items in one BatchGetItem; a waiting tenant's mark put back when a task parked as its
        # list was found empty (only under FLEET#).
        iam.PolicyStatement(
            sid="FleetShares",
            actions=["dynamodb:BatchGetItem"],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [tenant_pk("*"), "FLEET*"]}},
        ),
        iam.PolicyStatement(
            sid="FleetMarks",
            actions=["dynamodb:PutItem"],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["FLEET*"]}},
        ),
        iam.PolicyStatement(
            sid="Enqueue",
            # ChangeMessageVisibility: a dead worker's held messages are made visible again
            actions=["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:ChangeMessageVisibility"],
            resources=[q.queue_arn for q in data.queues.values()],
        ),
        *_liveness_statements(data),
    ):
        sweeper.add_to_role_policy(statement)
    events.Rule(
        scope,
        "SweeperSchedule",
        description="agentq: run the sweeper",
        schedule=events.Schedule.rate(cdk.Duration.minutes(sc.every_minutes)),
        targets=[targets.LambdaFunction(sweeper, retry_attempts=0)],
    )
    return sweeper


def _reaper(
    scope: Construct,
    cfg: EnvironmentSettings,
    data: Data,
    function: Callable[..., lambda_.Function],
    removal: cdk.RemovalPolicy,
) -> tuple[lambda_.Function, sqs.Queue]:
    """The reaper on the table's stream: only TTL deletions of task META reach it (the filter
    is ``agentq.control.retention.ttl_removal_pattern``); each one purges that task's remaining items,
    its budget and its payloads. A batch that keeps failing is split in halves to isolate the
    bad record, and one that still fails after the retries lands in the reaper DLQ."""
    names = cfg.names
    rc = cfg.reaper
    reaper = function(
        "reaper",
        memory=rc.memory_mb,
        timeout=rc.timeout_seconds,
        env={
            "AGENTQ_PREFIX": names.prefix,
            "AGENTQ_TABLE": data.table.table_name,
            "AGENTQ_BUCKET": data.payloads.bucket_name,
            "AGENTQ_TASK_RETENTION_DAYS": str(cfg.task_retention_days),
            "POWERTOOLS_LOG_LEVEL": cfg.log_level,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        },
        reserved=None,
        description="agentq reaper: purges a task's items and payloads once TTL deleted its META",
    )
    reaper.add_to_role_policy(
        iam.PolicyStatement(sid="PurgeTaskItems", actions=REAPER_TABLE_ACTIONS, resources=[data.table.table_arn])
    )
    reaper.add_to_role_policy(
        iam.PolicyStatement(sid="DeletePayloads", actions=REAPER_PAYLOAD_ACTIONS, resources=[payload_objects(data)])
    )
    reaper.add_to_role_policy(
        iam.PolicyStatement(
            sid="ListPayloads",
            actions=["s3:ListBucket"],
            resources=[data.payloads.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{PAYLOAD_PREFIX}*"]}},
        )
    )
    dlq = sqs.Queue(
        scope,
        "ReaperDlq",
        queue_name=f"{names.prefix}-reaper-dlq",
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        retention_period=cdk.Duration.seconds(cfg.dlq_retention_seconds),
        removal_policy=removal,
    )
    reaper.add_event_source(
        sources.DynamoEventSource(
            data.table,
            # From the oldest record the stream holds (24 h): a mapping created or re-enabled
            # after some expiries still reaps them.
            starting_position=lambda_.StartingPosition.TRIM_HORIZON,
            batch_size=rc.batch_size,
            bisect_batch_on_error=True,
            retry_attempts=rc.retry_attempts,
            report_batch_item_failures=True,
            on_failure=sources.SqsDlq(dlq),
            filters=[lambda_.FilterCriteria.filter(ttl_removal_pattern())],
        )
    )
    return reaper, dlq
