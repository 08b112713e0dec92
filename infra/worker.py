"""The optional long-running worker: ``agentq worker`` on ECS Fargate, for tasks whose tool
calls outlast a Lambda slice. Off unless ``worker.enabled``; the image is ``worker.image`` if
set, else the repo's Dockerfile with ``user_code`` in it, built by CDK at deploy time.

It polls the same tier queues as the Lambda executor and follows the same per-message policy,
so the two can run side by side. It scales in steps on the backlog (messages waiting or in
flight across the tiers); on scale-in ECS sends SIGTERM and the worker drains: steps in
flight commit, leases are released and each task gets a continuation message.

Least privilege: the tasks run in private subnets (no public IP, no inbound path), leave
through a NAT gateway on TCP 80 and 443 only (AWS APIs, the model API, http_fetch), reach
DynamoDB and S3 through gateway endpoints, and run as uid 65534 with every Linux capability
dropped and a read-only root filesystem (a scratch volume at /tmp). Fargate forbids the
namespaces bubblewrap needs, so python_exec's code goes to the sandbox function instead
(``AGENTQ_SANDBOX=lambda``); http_fetch refuses the ECS credentials endpoint like any other
link-local address.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.observe.names import NAMESPACE as METRICS_NAMESPACE
from agentq.resources import TIERS
from infra.access import vault_env
from infra.build_layers import ROOT
from infra.data import Data
from infra.fargate import fargate_task_definition
from infra.retention import add_flow_logs, log_group
from infra.sandbox import Sandbox
from infra.settings import EnvironmentSettings
from infra.task_runners import grant_task_runner, grant_user_code, task_runner_env, user_code_env
from infra.telemetry import add_collector_sidecar, otel_env

ECR_IMAGE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/(?P<repo>[^:@]+)"
)
STOP_TIMEOUT_SECONDS = 120  # ECS's maximum; the worker drains steps in flight for up to 60 s
WORKER_USER = "65534:65534"  # nobody: present in every Debian- or Alpine-based image
EGRESS_PORTS = (443, 80)


@dataclass
class Worker:
    service: ecs.FargateService
    cluster: ecs.Cluster
    vpc: ec2.Vpc
    security_group: ec2.SecurityGroup
    task_definition: ecs.FargateTaskDefinition
    pulls_from_ecr: bool


def build_worker(
    scope: Construct, env_name: str, cfg: EnvironmentSettings, data: Data, machine: sfn.StateMachine, sandbox: Sandbox
) -> Worker:
    w = cfg.worker
    vpc, security_group = _network(scope, cfg)
    cluster = ecs.Cluster(
        scope,
        "WorkerCluster",
        cluster_name=f"{cfg.prefix}-workers",
        vpc=vpc,
        container_insights_v2=ecs.ContainerInsights.ENABLED,
    )
    task_def = _task_definition(scope, env_name, cfg, data, machine, sandbox)
    pulls_from_ecr = _grant_image_pull(task_def, w.image) if w.image else True
    service = ecs.FargateService(
        scope,
        "WorkerService",
        service_name=f"{cfg.prefix}-worker",
        cluster=cluster,
        task_definition=task_def,
        desired_count=w.min_tasks,
        assign_public_ip=False,
        vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        security_groups=[security_group],
        min_healthy_percent=100,
        circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
    )
    _scale_on_backlog(service, cfg, data)
    return Worker(
        service=service,
        cluster=cluster,
        vpc=vpc,
        security_group=security_group,
        task_definition=task_def,
        pulls_from_ecr=pulls_from_ecr,
    )


def _network(scope: Construct, cfg: EnvironmentSettings) -> tuple[ec2.Vpc, ec2.SecurityGroup]:
    """Tasks in private subnets; the public subnets hold only the NAT gateway(s). No ingress,
    egress on TCP 443 and 80 only; DynamoDB and S3 through gateway endpoints; flow logs kept."""
    vpc = worker_vpc(scope, cfg)
    security_group = ec2.SecurityGroup(
        scope,
        "WorkerSecurityGroup",
        vpc=vpc,
        allow_all_outbound=False,
        description="agentq worker: no ingress; egress TCP 443 and 80 only",
    )
    for port in EGRESS_PORTS:
        security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(port), f"HTTP{'S' if port == 443 else ''} out")
    return vpc, security_group


def worker_vpc(scope: Construct, cfg: EnvironmentSettings) -> ec2.Vpc:
    """The workers' VPC (the Fargate worker's, and the EC2 workspace tier's: one per stack):
    private subnets behind ``worker.nat_gateways`` NAT gateways, DynamoDB and S3 gateway
    endpoints, flow logs kept."""
    w = cfg.worker
    vpc = ec2.Vpc(
        scope,
        "WorkerVpc",
        ip_addresses=ec2.IpAddresses.cidr(w.vpc_cidr),
        max_azs=2,
        nat_gateways=w.nat_gateways,
        subnet_configuration=[
            ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
            ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=22),
        ],
        gateway_endpoints={
            "DynamoDb": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
            "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
        },
        restrict_default_security_group=False,
    )
    add_flow_logs(scope, vpc, "WorkerVpcFlowLogs", cfg)
    return vpc


def _task_definition(
    scope: Construct, env_name: str, cfg: EnvironmentSettings, data: Data, machine: sfn.StateMachine, sandbox: Sandbox
) -> ecs.FargateTaskDefinition:
    """``agentq worker`` as uid 65534, every capability dropped, a read-only root filesystem (a
    scratch volume at /tmp), a task runner's variables and grants (``infra/task_runners.py``)."""
    w = cfg.worker
    task_def = fargate_task_definition(scope, "WorkerTask", cfg, cpu=w.cpu, memory_mb=w.memory_mb)
    logs_group = log_group(scope, "WorkerLogs", cfg)
    environment = {
        "AGENTQ_ENV": env_name,
        "AGENTQ_PREFIX": cfg.prefix,
        "AGENTQ_TABLE": data.table.table_name,
        "AGENTQ_BUCKET": data.payloads.bucket_name,
        "AGENTQ_STATE_MACHINE_ARN": machine.state_machine_arn,
        **task_runner_env(cfg, sandbox),
        **vault_env(data),
        **user_code_env(cfg),
        **otel_env(cfg, "agentq-worker"),
        "HOME": "/tmp",  # the only writable place
        "AGENTQ_EMF": "1",  # the worker prints EMF lines; the awslogs driver ships them
        "AGENTQ_LOG_FORMAT": "json",  # powertools JSON lines with task_id and step, for Logs Insights
        "AWS_REGION": cdk.Aws.REGION,
        "POWERTOOLS_SERVICE_NAME": "agentq-worker",
        "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        "POWERTOOLS_LOG_LEVEL": cfg.log_level,
    }
    task_def.add_volume(name="tmp")  # task storage: the root filesystem stays read-only
    linux = ecs.LinuxParameters(scope, "WorkerLinuxParameters", init_process_enabled=True)
    linux.drop_capabilities(ecs.Capability.ALL)
    container = task_def.add_container(
        "worker",
        image=worker_image(cfg),
        command=[
            "agentq",
            "worker",
            "--concurrency",
            str(w.concurrency),
            "--heartbeat",
            str(w.heartbeat_seconds),
            "--lease",
            str(w.lease_seconds),
            "--visibility",
            str(w.visibility_seconds),
            "--max-receive-count",
            str(cfg.max_receive_count),
        ],
        environment=environment,
        logging=ecs.LogDrivers.aws_logs(stream_prefix="worker", log_group=logs_group),
        stop_timeout=cdk.Duration.seconds(STOP_TIMEOUT_SECONDS),
        user=WORKER_USER,
        readonly_root_filesystem=True,
        linux_parameters=linux,
    )
    container.add_mount_points(ecs.MountPoint(container_path="/tmp", source_volume="tmp", read_only=False))
    add_collector_sidecar(task_def, container, cfg, logs_group)  # tracing.exporter = "adot" only
    grant_task_runner(task_def.task_role, data, machine, cfg, sandbox, receive=True)
    grant_user_code(task_def.task_role, cfg, runs_tools=True)
    return task_def


def _scale_on_backlog(service: ecs.FargateService, cfg: EnvironmentSettings, data: Data) -> None:
    """Steps on the backlog (messages waiting or in flight across the tiers): in one task at a
    time, only when nothing waits or runs; out by ``worker.scale_out``."""
    w = cfg.worker
    backlog = cw.MathExpression(
        expression="+".join(f"v{i}+f{i}" for i in range(len(TIERS))),
        using_metrics={
            **{
                f"v{i}": data.queues[t].metric_approximate_number_of_messages_visible(statistic="Maximum")
                for i, t in enumerate(TIERS)
            },
            **{
                f"f{i}": data.queues[t].metric_approximate_number_of_messages_not_visible(statistic="Maximum")
                for i, t in enumerate(TIERS)
            },
        },
        label="backlog (waiting + in flight)",
        period=cdk.Duration.minutes(1),
    )
    scaling = service.auto_scale_task_count(min_capacity=w.min_tasks, max_capacity=w.max_tasks)
    scaling.scale_on_metric(
        "ScaleOnBacklog",
        metric=backlog,
        adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
        scaling_steps=[appscaling.ScalingInterval(upper=0, change=-1)]
        + [appscaling.ScalingInterval(lower=s.backlog, change=s.change) for s in w.scale_out],
        cooldown=cdk.Duration.minutes(2),
        evaluation_periods=1,
    )


# What the image build never needs: the asset hash covers the rest of the project.
IMAGE_EXCLUDES = [".venv", ".git", "cdk.out", "node_modules", "**/__pycache__", "**/*.pyc", ".mypy_cache",
                  ".ruff_cache", ".pytest_cache", ".hypothesis", ".import_linter_cache", "bench/out", "docs"]  # fmt: skip


def worker_image(cfg: EnvironmentSettings) -> ecs.ContainerImage:
    """``worker.image`` if given; else the repo's Dockerfile, built by CDK at deploy time (an
    asset: synth only fingerprints the files), with ``user_code`` baked in."""
    if cfg.worker.image:
        return ecs.ContainerImage.from_registry(cfg.worker.image)
    user = cfg.user_code
    args = {"USER_CODE_DIR": user.package_dir, "USER_REQUIREMENTS": user.requirements or ""} if user else {}
    if cfg.tracing.exporter == "adot":
        args["AGENTQ_EXTRAS"] = "otel"  # the OpenTelemetry SDK that sends to the collector sidecar
    platform = ecr_assets.Platform.LINUX_ARM64 if cfg.architecture == "arm64" else ecr_assets.Platform.LINUX_AMD64
    return ecs.ContainerImage.from_asset(
        str(ROOT), file="Dockerfile", build_args=args, exclude=IMAGE_EXCLUDES, platform=platform
    )


def _grant_image_pull(task_def: ecs.FargateTaskDefinition, image: str) -> bool:
    """``from_registry`` grants nothing; a private ECR image needs pull rights on its repo."""
    match = ECR_IMAGE.match(image)
    if not match:
        return False  # a public registry: nothing to grant
    role = task_def.obtain_execution_role()
    repo_arn = f"arn:{cdk.Aws.PARTITION}:ecr:{match['region']}:{match['account']}:repository/{match['repo']}"
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="PullWorkerImage",
            actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            resources=[repo_arn],
        )
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(sid="EcrLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"])
    )
    return True
