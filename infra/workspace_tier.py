"""The EC2 workspace tier (``workspace.tier: "ec2"``): where tasks with a workspace run in AWS.

Lambda and Fargate allow no user namespaces, so bubblewrap, which the workspace tools
(``shell``, the file tools) run in, cannot start there: those tools fail closed
(``SandboxUnavailable``). This tier gives such tasks hosts that can run them:

- **Queues of their own** (``{prefix}-workspace-{tier}``, each with its DLQ, the tier queues'
  settings): the API sends a task with a workspace there (``TaskQueues.pool_for``), and the
  executor or the Fargate worker forwards any of its messages that reaches them
  (``AGENTQ_WORKSPACE_POOL``), so a host without the sandbox never starts it. The fan-out
  state machine may send to them: a spawn from this pool runs its children and wakes its parent here.
- **An Auto Scaling group** of Amazon Linux 2023 instances (whose kernel allows unprivileged
  user namespaces) in the worker VPC's private subnets, no public IP, IMDSv2 required with a hop
  limit of 1, an encrypted gp3 root volume. Its user data installs bubblewrap and Python 3.12
  from the distribution and agentq from the stack's own assets (the Lambda layers' code, its
  pinned dependencies, a pinned boto3 and your tools), then the systemd unit of
  ``infra/workspace_unit.py``: ``agentq worker`` on the workspace pool, as an unprivileged user.
  It scales in steps on the pool's backlog (waiting plus in flight).
- **A role** with a task runner's grants (``infra/task_runners.py``, as the Fargate worker's),
  receiving only from the workspace queues, the objects of its own artifacts, its log group, but
  denied every task's workspace objects (``tasks/*/workspace/*``): those it reaches only through
  **the workspace objects role**, which it assumes per task with a session policy naming that
  task's prefix (``agentq.storage.workspace_access``), so one task's run cannot reach another's.
- **Scale-in that drains**: a termination lifecycle hook holds an instance the group scales in
  while its worker, which reads the instance's target lifecycle state from IMDSv2, stops claiming,
  lets running turns commit and hands its tasks back, then completes the lifecycle action
  (``agentq.scale_in``).
- **Alarms**: a workspace queue whose messages wait untaken for ``starved_minutes``, a message
  in a workspace DLQ, and a worker that found it could not sandbox (its ``sandbox_unavailable``
  line, counted by a metric filter on the log group the CloudWatch agent ships to).

Why not ECS on EC2: a container would need Docker's seccomp profile off (it refuses the
``unshare``/``clone`` bwrap calls) and a ``/proc`` without Docker's masked paths (the kernel
refuses a new proc mount under them), which ECS offers only as a privileged container, more than
the worker should hold; docs/SANDBOX.md says more.
"""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.observe.names import NAMESPACE as METRICS_NAMESPACE
from agentq.queueing.queues import WORKSPACE_POOL, WORKSPACE_POOL_VARIABLE
from agentq.resources import TIERS
from agentq.sandbox.config import FUNCTION_VARIABLE
from agentq.storage.workspace_access import ROLE_VARIABLE as WORKSPACE_ROLE_VARIABLE
from infra import workspace_unit as unit
from infra.access import liveness_statements, vault_env
from infra.alarms import AlarmFactory
from infra.build_layers import BOTO_REQUIREMENTS, CORE_LAYER_DIR, DepsLayer, build_deps_layer
from infra.data import Data, tier_queues
from infra.functions import Functions
from infra.layers import ASSET_EXCLUDES, BUILT_MARKER_EXCLUDES, require_built
from infra.metrics import ONE_MINUTE
from infra.nag import Acknowledged, _ack
from infra.retention import log_retention, removal_policy
from infra.settings import EnvironmentSettings
from infra.task_runners import (
    HOLD_ACTIONS,
    RECEIVE_ACTIONS,
    SEND_ACTIONS,
    grant_task_runner,
    grant_user_code,
    task_runner_env,
    user_code_env,
)
from infra.worker import EGRESS_PORTS, Worker, worker_vpc
from infra.workspace_tier_access import WORKSPACE_OBJECTS, drain_on_termination, workspace_objects_role

SANDBOX_UNAVAILABLE_METRIC = "workspace_sandbox_unavailable"


@dataclass
class WorkspaceTier:
    queues: dict[str, sqs.Queue]
    dlqs: dict[str, sqs.Queue]
    group: autoscaling.AutoScalingGroup
    launch_template: ec2.LaunchTemplate
    role: iam.Role
    security_group: ec2.SecurityGroup
    log_group: logs.LogGroup
    alarms: list[cw.Alarm]
    objects_role: iam.Role


def build_workspace_tier(
    scope: Construct,
    env_name: str,
    cfg: EnvironmentSettings,
    data: Data,
    machine: sfn.StateMachine,
    fns: Functions,
    worker: Worker | None,
    topic: sns.Topic,
    user_layer: DepsLayer | None,
    deps_layer: DepsLayer,
) -> WorkspaceTier:
    queues, dlqs = tier_queues(scope, cfg, WORKSPACE_POOL)  # as the default ones (infra/data.py)
    _route(cfg, fns, worker, queues)
    # A spawn's children and its parent's wake go to the queue of the pool the parent runs in
    # (its launcher names them: queueing/stepfunctions.py), so a task on this pool fans out here.
    machine.add_to_role_policy(
        iam.PolicyStatement(
            sid="RunChildrenWakeParentInWorkspacePool",
            actions=["sqs:SendMessage"],
            resources=[q.queue_arn for q in queues.values()],
        )
    )
    vpc = worker.vpc if worker is not None else worker_vpc(scope, cfg)
    security_group = ec2.SecurityGroup(
        scope,
        "WorkspaceSecurityGroup",
        vpc=vpc,
        allow_all_outbound=False,
        description="agentq workspace tier: no ingress; egress TCP 443 and 80 only",
    )
    for port in EGRESS_PORTS:
        security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(port), f"HTTP{'S' if port == 443 else ''} out")
    log_group = logs.LogGroup(
        scope,
        "WorkspaceWorkerLogs",
        log_group_name=f"/agentq/{cfg.prefix}/workspace-worker",
        retention=log_retention(cfg.log_retention_days),
        removal_policy=removal_policy(cfg),
    )
    role = iam.Role(
        scope,
        "WorkspaceWorkerRole",
        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
        description="agentq workspace tier instances: a task runner's grants on the workspace pool's queues",
    )
    _grant(role, cfg, data, machine, fns, queues, dlqs, log_group)
    objects_role = workspace_objects_role(scope, role, data)
    launch_template = _launch_template(scope, env_name, cfg, data, machine, fns, role, security_group, log_group,
                                       user_layer, deps_layer, objects_role)  # fmt: skip
    w = cfg.workspace.ec2
    group = autoscaling.AutoScalingGroup(
        scope,
        "WorkspaceWorkers",
        auto_scaling_group_name=unit.group_name(cfg.prefix),
        vpc=vpc,
        vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        launch_template=launch_template,
        min_capacity=w.min_instances,
        max_capacity=w.max_instances,
        group_metrics=[autoscaling.GroupMetrics.all()],
    )
    _scale_on_backlog(group, cfg, queues)
    drain_on_termination(group, role, cfg)
    alarms = _alarms(scope, cfg, queues, dlqs, log_group, topic)
    return WorkspaceTier(queues, dlqs, group, launch_template, role, security_group, log_group, alarms, objects_role)


def _route(cfg: EnvironmentSettings, fns: Functions, worker: Worker | None, queues: dict[str, sqs.Queue]) -> None:
    """The API sends tasks with a workspace to the pool; the executor and the Fargate worker
    forward such tasks' messages to it (and submit sub-agents there): each gets the variable and
    the right to send to the pool's queues, nothing more of them."""
    senders: list[iam.IGrantable] = [fns.api, fns.executor]
    fns.api.add_environment(WORKSPACE_POOL_VARIABLE, WORKSPACE_POOL)
    fns.a2a.add_environment(WORKSPACE_POOL_VARIABLE, WORKSPACE_POOL)  # it submits as the API does (infra/a2a.py)
    fns.executor.add_environment(WORKSPACE_POOL_VARIABLE, WORKSPACE_POOL)
    if worker is not None:
        container = worker.task_definition.default_container
        if container is None:
            raise ValueError("the Fargate worker has no container")
        container.add_environment(WORKSPACE_POOL_VARIABLE, WORKSPACE_POOL)
        senders.append(worker.task_definition.task_role)
    for grantee in senders:
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="SendToWorkspaceQueues", actions=SEND_ACTIONS, resources=[q.queue_arn for q in queues.values()]
            )
        )


def _grant(
    role: iam.Role,
    cfg: EnvironmentSettings,
    data: Data,
    machine: sfn.StateMachine,
    fns: Functions,
    queues: dict[str, sqs.Queue],
    dlqs: dict[str, sqs.Queue],
    log_group: logs.LogGroup,
) -> None:
    """A task runner's grants (table partitions, ``tasks/`` objects, sending to the default tier
    queues for sub-agents, the fan-out machine, Bedrock, events, secrets), worker liveness, and of
    the workspace pool: receiving, holding and sending its messages, dead-lettering to its DLQs."""
    grant_task_runner(role, data, machine, cfg, fns.sandbox, receive=False, invoke_sandbox=False)
    grant_user_code(role, cfg, runs_tools=True)
    for statement in [
        *liveness_statements(data),
        iam.PolicyStatement(
            sid="WorkspaceQueues",
            actions=[*RECEIVE_ACTIONS, *HOLD_ACTIONS, *SEND_ACTIONS],
            resources=[q.queue_arn for q in queues.values()],
        ),
        iam.PolicyStatement(sid="WorkspaceDlqs", actions=SEND_ACTIONS, resources=[q.queue_arn for q in dlqs.values()]),
        iam.PolicyStatement(
            sid="WorkerLogs",
            actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[log_group.log_group_arn],
        ),
    ]:
        role.add_to_principal_policy(statement)


def _artifacts(
    scope: Construct, cfg: EnvironmentSettings, user_layer: DepsLayer | None, deps_layer: DepsLayer
) -> dict[str, s3_assets.Asset]:
    """The stack's own artifacts, as S3 assets: the core library and its pinned dependencies (the
    Lambda layers' directories), boto3 pinned by the constraints, your tools."""
    boto = require_built(
        scope,
        build_deps_layer(cfg.architecture, requirements=BOTO_REQUIREMENTS, prune=("bin",)),
        "The EC2 workspace tier's boto3 must be built before a deployable synth.",
    )
    dirs = {"core": (CORE_LAYER_DIR, ASSET_EXCLUDES), "deps": (deps_layer.path, BUILT_MARKER_EXCLUDES),
            "boto": (boto.path, BUILT_MARKER_EXCLUDES)}  # fmt: skip
    if user_layer is not None:
        dirs["user"] = (user_layer.path, BUILT_MARKER_EXCLUDES)
    return {
        name: s3_assets.Asset(scope, f"Workspace{name.capitalize()}Artifact", path=str(path), exclude=exclude)
        for name, (path, exclude) in dirs.items()
    }


def _launch_template(
    scope: Construct,
    env_name: str,
    cfg: EnvironmentSettings,
    data: Data,
    machine: sfn.StateMachine,
    fns: Functions,
    role: iam.Role,
    security_group: ec2.SecurityGroup,
    log_group: logs.LogGroup,
    user_layer: DepsLayer | None,
    deps_layer: DepsLayer,
    objects_role: iam.Role,
) -> ec2.LaunchTemplate:
    w = cfg.workspace.ec2
    artifacts = _artifacts(scope, cfg, user_layer, deps_layer)
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="WorkerArtifacts",
            actions=["s3:GetObject"],
            resources=[a.bucket.arn_for_objects(a.s3_object_key) for a in artifacts.values()],
        )
    )
    runner_env = {k: v for k, v in task_runner_env(cfg, fns.sandbox).items() if k != FUNCTION_VARIABLE}
    resources = {
        "AGENTQ_ENV": env_name,
        "AGENTQ_PREFIX": cfg.prefix,
        "AGENTQ_TABLE": data.table.table_name,
        "AGENTQ_BUCKET": data.payloads.bucket_name,
        "AGENTQ_STATE_MACHINE_ARN": machine.state_machine_arn,
        **runner_env,
        **vault_env(data),
        **user_code_env(cfg),
        WORKSPACE_ROLE_VARIABLE: objects_role.role_arn,
        unit.HOOK_VARIABLE: unit.lifecycle_hook_name(cfg.prefix),
        unit.GROUP_VARIABLE: unit.group_name(cfg.prefix),
        "AGENTQ_EMF": "1",
        "AGENTQ_LOG_FORMAT": "json",
        "AWS_REGION": cdk.Aws.REGION,
        "POWERTOOLS_SERVICE_NAME": "agentq-workspace-worker",
        "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        "POWERTOOLS_LOG_LEVEL": cfg.log_level,
    }
    args = unit.worker_args(
        concurrency=w.concurrency,
        heartbeat=cfg.worker.heartbeat_seconds,
        lease=cfg.worker.lease_seconds,
        visibility=cfg.worker.visibility_seconds,
        max_receive_count=cfg.max_receive_count,
    )
    user_data = ec2.UserData.for_linux()
    user_data.add_commands("set -euo pipefail")
    downloads = {
        name: user_data.add_s3_download_command(
            bucket=a.bucket, bucket_key=a.s3_object_key, local_file=f"/tmp/agentq-{name}.zip"
        )
        for name, a in artifacts.items()
    }
    user_data.add_commands(
        *unit.boot_script(
            unit_text=unit.unit(args),
            env_text=unit.environment_file(unit.environment(resources)),
            downloads=downloads,
            log_group=log_group.log_group_name,
            region=cdk.Aws.REGION,
        )
    )
    arm = cfg.architecture == "arm64"
    return ec2.LaunchTemplate(
        scope,
        "WorkspaceLaunchTemplate",
        launch_template_name=f"{cfg.prefix}-workspace",
        machine_image=ec2.MachineImage.latest_amazon_linux2023(
            cpu_type=ec2.AmazonLinuxCpuType.ARM_64 if arm else ec2.AmazonLinuxCpuType.X86_64
        ),
        instance_type=ec2.InstanceType(w.instance_type),
        role=role,
        security_group=security_group,
        user_data=user_data,
        require_imdsv2=True,
        http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
        http_put_response_hop_limit=1,
        instance_metadata_tags=False,
        associate_public_ip_address=False,
        detailed_monitoring=True,
        block_devices=[
            ec2.BlockDevice(
                device_name="/dev/xvda",
                volume=ec2.BlockDeviceVolume.ebs(
                    w.root_volume_gb,
                    encrypted=True,
                    volume_type=ec2.EbsDeviceVolumeType.GP3,
                    delete_on_termination=True,
                ),
            )
        ],
    )


def backlog_metric(queues: dict[str, sqs.Queue]) -> cw.MathExpression:
    """Messages waiting or in flight across the workspace pool's tiers."""
    using: dict[str, cw.IMetric] = {}
    for i, tier in enumerate(TIERS):
        using[f"v{i}"] = queues[tier].metric_approximate_number_of_messages_visible(statistic="Maximum")
        using[f"f{i}"] = queues[tier].metric_approximate_number_of_messages_not_visible(statistic="Maximum")
    return cw.MathExpression(
        expression="+".join(f"v{i}+f{i}" for i in range(len(TIERS))),
        using_metrics=using,
        label="workspace backlog (waiting + in flight)",
        period=ONE_MINUTE,
    )


def _scale_on_backlog(
    group: autoscaling.AutoScalingGroup, cfg: EnvironmentSettings, queues: dict[str, sqs.Queue]
) -> None:
    """In one instance at a time when nothing waits or runs; out by ``workspace.ec2.scale_out``."""
    group.scale_on_metric(
        "ScaleOnWorkspaceBacklog",
        metric=backlog_metric(queues),
        adjustment_type=autoscaling.AdjustmentType.CHANGE_IN_CAPACITY,
        scaling_steps=[autoscaling.ScalingInterval(upper=0, change=-1)]
        + [autoscaling.ScalingInterval(lower=s.backlog, change=s.change) for s in cfg.workspace.ec2.scale_out],
        evaluation_periods=1,
    )


def _alarms(
    scope: Construct,
    cfg: EnvironmentSettings,
    queues: dict[str, sqs.Queue],
    dlqs: dict[str, sqs.Queue],
    log_group: logs.LogGroup,
    topic: sns.Topic,
) -> list[cw.Alarm]:
    alarm = AlarmFactory(scope, cfg.prefix, topic)
    minutes = cfg.workspace.ec2.starved_minutes
    for tier in TIERS:
        # Visible messages only (a worker holds a running task's message for hours, so the age of
        # the oldest would fire on any long task): a message still waiting at every minute's
        # lowest count for `minutes` means no instance takes it (none running, all full at the
        # maximum, or none can sandbox).
        alarm(
            f"Workspace{tier.capitalize()}QueueStarved",
            queues[tier].metric_approximate_number_of_messages_visible(period=ONE_MINUTE, statistic="Minimum"),
            1,
            f"workspace {tier} queue: a task with a workspace has waited {minutes} minutes untaken: the EC2 tier has "
            "no instance, is full at workspace.ec2.max_instances, or its instances cannot sandbox "
            "(see the sandbox-unavailable alarm)",
            periods=minutes,
        )
        alarm(
            f"Workspace{tier.capitalize()}DlqNotEmpty",
            dlqs[tier].metric_approximate_number_of_messages_visible(period=ONE_MINUTE, statistic="Maximum"),
            cfg.alarms.dlq_messages,
            f"workspace {tier} DLQ holds a message: a task failed after all retries. "
            "Runbook: docs/DEPLOY.md#runbook-redriving-a-dlq (AGENTQ_QUEUE_POOL=workspace)",
        )
    metric = logs.MetricFilter(
        scope,
        "WorkspaceSandboxUnavailableFilter",
        log_group=log_group,
        filter_pattern=logs.FilterPattern.literal(unit.SANDBOX_UNAVAILABLE),
        metric_namespace=METRICS_NAMESPACE,
        metric_name=SANDBOX_UNAVAILABLE_METRIC,
        metric_value="1",
    ).metric(period=cdk.Duration.minutes(5), statistic="Sum")
    alarm(
        "WorkspaceSandboxUnavailable",
        metric,
        1,
        "an EC2 workspace worker could not run a bubblewrap sandbox and refused to claim tasks (its log line "
        "sandbox_unavailable says why: no user namespaces, bubblewrap missing)",
    )
    return alarm.alarms


def acknowledge_workspace_tier(stack: Acknowledged, tier: WorkspaceTier) -> None:
    """The tier's cdk-nag findings, each with its reason (as infra/nag.py does for the rest)."""
    from infra.nag import PARTITION_REGION_ACCOUNT, _logical_id, acknowledge_task_runner

    acknowledge_task_runner(stack, tier.role)
    _ack(
        tier.objects_role,
        f"AwsSolutions-IAM5[Resource::<{_logical_id(stack.data.payloads)}.Arn>/{WORKSPACE_OBJECTS}]",
        "The most a per-task session may hold: Get/PutObject of workspace objects, keyed tasks/<task_id>/workspace/...; "
        "each session's policy names one task's prefix (agentq.storage.workspace_access), and the session gets the "
        "intersection.",
    )
    group_arn = PARTITION_REGION_ACCOUNT.format(service="autoscaling")
    _ack(
        tier.role,
        f"AwsSolutions-IAM5[Resource::{group_arn}:autoScalingGroup:*:autoScalingGroupName/{unit.group_name(stack.settings.prefix)}]",
        "A group's ARN carries a UUID Auto Scaling assigns; the grant is CompleteLifecycleAction on this tier's group, "
        "named, only.",
    )
    _ack(
        tier.group,
        "AwsSolutions-AS3",
        "Scaling activities are visible in the group's activity history and its group metrics; what an operator must act "
        "on is alarmed instead: a workspace queue starved, a DLQ not empty, a worker that cannot sandbox.",
    )
