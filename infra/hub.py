"""The events hub: ``python -m agentq.hub`` on ECS Fargate behind an Application Load Balancer,
serving every watcher's ``GET /tasks/{id}/events`` (docs/ARCHITECTURE.md, invariant 10, "Live
events at scale"). On when ``live.hub`` (with ``live.hub_domain`` and its ACM certificate: the
watchers send their keys, so HTTPS only); the API's ``GET /health`` then names
``https://<hub_domain>`` and the clients follow it.

Why Fargate and an ALB, not API Gateway or Lambda: a watcher is an open connection for minutes to
hours. On Lambda it holds an execution the whole time (what this replaces); through API Gateway
a WebSocket bills every message delivered; an ALB bills by connections and bytes (LCUs), so
10,000 idle watchers cost about one LCU of connections. One server: DynamoDB Streams throttles
more than two readers of a shard, each server reads the whole stream (every watcher may land on
any), and the reaper's event source mapping is the other reader (``infra/live_settings.py``), so
the hub grows by the size of its task, not their number (``live.hub_cpu``). When it is down (a
crash, a deployment: the old task stops before the new one starts) watchers use the API's route.

Apart from the agents: its own VPC, cluster and service (the executors' reserved concurrency and
the worker's tasks are untouched by it), and its role reads the table, its stream and the
payload objects and writes nothing, so a flood of watchers can spend only the hub's own
capacity and the table's reads, never a write unit of a step. Its tasks run in public subnets
with a public address and no inbound path but the load balancer (no NAT gateway: DynamoDB
Streams has no gateway endpoint), as uid 65534, every capability dropped, a read-only root.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from constructs import Construct, IConstruct

from agentq.api.event_hub import AUTHORIZE_ENV
from agentq.api.oidc import OIDC_ENV
from agentq.resources import PAYLOAD_PREFIX
from infra.alarms import AlarmFactory
from infra.data import Data
from infra.fargate import fargate_task_definition
from infra.metrics import FIVE_MINUTES
from infra.retention import add_flow_logs, log_group
from infra.settings import EnvironmentSettings
from infra.worker import WORKER_USER, worker_image

PORT = 8080
IDLE_TIMEOUT_SECONDS = 120  # the hub sends a keep-alive every 15 s; a silent connection longer than this is dead


@dataclass
class Hub:
    url: str
    service: ecs.FargateService
    task_definition: ecs.FargateTaskDefinition
    load_balancer: elbv2.ApplicationLoadBalancer
    target_group: elbv2.ApplicationTargetGroup
    vpc: ec2.Vpc
    alarms: list[cw.Alarm]
    payloads_id: str  # the payload bucket's logical id (its grant's acknowledgement names it)


def build_hub(scope: Construct, env_name: str, cfg: EnvironmentSettings, data: Data) -> Hub:
    live = cfg.live
    assert live.hub_domain and live.hub_certificate_arn  # LiveSettings refuses a hub without them
    vpc = ec2.Vpc(
        scope,
        "HubVpc",
        ip_addresses=ec2.IpAddresses.cidr("10.41.0.0/16"),
        max_azs=2,
        nat_gateways=0,
        subnet_configuration=[ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24)],
        gateway_endpoints={
            "DynamoDb": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB)
        },
        restrict_default_security_group=False,
    )
    add_flow_logs(scope, vpc, "HubVpcFlowLogs", cfg)
    cluster = ecs.Cluster(scope, "HubCluster", vpc=vpc, container_insights_v2=ecs.ContainerInsights.ENABLED)

    task_def = _task_definition(scope, env_name, cfg, data)
    lb_sg = ec2.SecurityGroup(
        scope,
        "HubLbSecurityGroup",
        vpc=vpc,
        allow_all_outbound=False,
        description="agentq events hub load balancer: HTTPS from watchers",
    )
    lb_sg.add_ingress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "watchers (HTTPS)")
    lb_sg.add_ingress_rule(ec2.Peer.any_ipv6(), ec2.Port.tcp(443), "watchers (HTTPS)")
    task_sg = ec2.SecurityGroup(
        scope,
        "HubSecurityGroup",
        vpc=vpc,
        allow_all_outbound=False,
        description="agentq events hub: the load balancer in, HTTPS to AWS APIs out",
    )
    task_sg.add_ingress_rule(lb_sg, ec2.Port.tcp(PORT), "the load balancer")
    task_sg.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "AWS APIs (HTTPS)")
    lb_sg.add_egress_rule(task_sg, ec2.Port.tcp(PORT), "the hub servers")

    service = ecs.FargateService(
        scope,
        "HubService",
        cluster=cluster,
        task_definition=task_def,
        desired_count=live.hub_tasks,
        # Never more servers than hub_tasks, even during a deployment: with the reaper's mapping,
        # two readers of a stream shard at most. ECS rounds the minimum up and the maximum down,
        # so with one server only a 0% minimum lets a deployment stop the old task first.
        min_healthy_percent=0,
        max_healthy_percent=100,
        assign_public_ip=True,
        security_groups=[task_sg],
        vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
        circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
    )
    alb = elbv2.ApplicationLoadBalancer(
        scope,
        "HubLoadBalancer",
        vpc=vpc,
        internet_facing=True,
        security_group=lb_sg,
        idle_timeout=cdk.Duration.seconds(IDLE_TIMEOUT_SECONDS),
        drop_invalid_header_fields=True,
    )
    listener = alb.add_listener(
        "Https",
        port=443,
        protocol=elbv2.ApplicationProtocol.HTTPS,
        certificates=[acm.Certificate.from_certificate_arn(scope, "HubCertificate", live.hub_certificate_arn)],
        ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS,
        open=False,
    )
    target_group = listener.add_targets(
        "Hub",
        port=PORT,
        protocol=elbv2.ApplicationProtocol.HTTP,
        targets=[service],
        health_check=elbv2.HealthCheck(
            path="/health",
            healthy_http_codes="200",
            interval=cdk.Duration.seconds(10),
            healthy_threshold_count=2,
            unhealthy_threshold_count=3,
        ),
        deregistration_delay=cdk.Duration.seconds(20),  # its streams drop; clients resume on the other
    )
    bucket = data.payloads.node.default_child
    assert isinstance(bucket, cdk.CfnElement)
    hub = Hub(
        url=f"https://{live.hub_domain}",
        service=service,
        task_definition=task_def,
        load_balancer=alb,
        target_group=target_group,
        vpc=vpc,
        alarms=[],
        payloads_id=cdk.Stack.of(scope).get_logical_id(bucket),
    )
    _acknowledge(hub)
    cdk.CfnOutput(
        scope,
        "EventsHubLoadBalancer",
        value=alb.load_balancer_dns_name,
        description=f"point {live.hub_domain} (CNAME) here: the events hub",
    )
    return hub


def _task_definition(
    scope: Construct, env_name: str, cfg: EnvironmentSettings, data: Data
) -> ecs.FargateTaskDefinition:
    live = cfg.live
    task_def = fargate_task_definition(scope, "HubTask", cfg, cpu=live.hub_cpu, memory_mb=live.hub_memory_mb)
    hub_logs = log_group(scope, "HubLogs", cfg)
    environment = {
        "AGENTQ_ENV": env_name,
        "AGENTQ_PREFIX": cfg.prefix,
        "AGENTQ_TABLE": data.table.table_name,
        "AGENTQ_BUCKET": data.payloads.bucket_name,
        "AWS_REGION": cdk.Aws.REGION,
        "HOME": "/tmp",
        "PORT": str(PORT),
        # The caps are per server: the deployment's figure split between them (api/stream_caps.py).
        "AGENTQ_HUB_STREAMS_PER_TENANT": str(math.ceil(live.streams_per_tenant / live.hub_tasks)),
        "AGENTQ_HUB_STREAMS_PER_USER": str(math.ceil(live.streams_per_user / live.hub_tasks)),
        # An open stream is authorised again this often: a revoked key stops as it does at the API.
        AUTHORIZE_ENV: str(cfg.api.authorizer_cache_seconds),
    }
    if cfg.oidc is not None:  # end users' tokens, verified as the API's authorizer verifies them
        environment[OIDC_ENV] = cfg.oidc.model_dump_json(exclude_none=True)
    task_def.add_volume(name="tmp")
    linux = ecs.LinuxParameters(scope, "HubLinuxParameters", init_process_enabled=True)
    linux.drop_capabilities(ecs.Capability.ALL)
    container = task_def.add_container(
        "hub",
        image=worker_image(cfg),
        command=["python", "-m", "agentq.hub"],
        environment=environment,
        port_mappings=[ecs.PortMapping(container_port=PORT)],
        logging=ecs.LogDrivers.aws_logs(stream_prefix="hub", log_group=hub_logs),
        user=WORKER_USER,
        readonly_root_filesystem=True,
        linux_parameters=linux,
        stop_timeout=cdk.Duration.seconds(20),
    )
    container.add_mount_points(ecs.MountPoint(container_path="/tmp", source_volume="tmp", read_only=False))
    # Least privilege: read the table (META, the log, API keys) and its stream, read the payloads
    # an event may point at; no write of any kind.
    role = task_def.task_role
    role.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["dynamodb:GetItem", "dynamodb:Query", "dynamodb:DescribeTable"], resources=[data.table.table_arn]
        )
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"],
            resources=[data.table.table_stream_arn or ""],
        )
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(actions=["s3:GetObject"], resources=[data.payloads.arn_for_objects(f"{PAYLOAD_PREFIX}*")])
    )
    return task_def


def hub_alarms(alarm: AlarmFactory, hub: Hub) -> list[cw.Alarm]:
    """The hub failing (5xx from it or the load balancer), hosts unhealthy (a server's stream
    reader stale: its /health is 503), or refusing connections: watchers fall back to the API's
    route, later but nothing lost."""
    tg, lb = hub.target_group.metrics, hub.load_balancer.metrics
    made = [
        alarm(
            "HubServer5xx",
            tg.http_code_target(elbv2.HttpCodeTarget.TARGET_5XX_COUNT, period=FIVE_MINUTES, statistic="Sum"),
            10,
            "the events hub answered 5xx ten times or more in five minutes: watchers fall back to the API's "
            "GET /tasks/{id}/events (the events function's reserved concurrency bounds them)",
        ),
        alarm(
            "HubLoadBalancer5xx",
            lb.http_code_elb(elbv2.HttpCodeElb.ELB_5XX_COUNT, period=FIVE_MINUTES, statistic="Sum"),
            10,
            "the events hub's load balancer answered 5xx ten times or more in five minutes (no healthy server, "
            "or refused connections): watchers fall back to the API's route",
        ),
        alarm(
            "HubUnhealthyHosts",
            tg.unhealthy_host_count(period=FIVE_MINUTES, statistic="Maximum"),
            1,
            "an events hub server failed its health check (its reader of the table's stream is stale, or it is "
            "down): its watchers moved to the API's route",
        ),
        alarm(
            "HubRejectedConnections",
            lb.rejected_connection_count(period=FIVE_MINUTES, statistic="Sum"),
            1,
            "the events hub's load balancer rejected connections (its connection limit): watchers fall back to "
            "the API's route; raise live.hub_cpu",
        ),
    ]
    hub.alarms = made
    return made


def _ack(scope: IConstruct | None, rule: str, reason: str) -> None:
    if scope is None:
        raise ValueError(f"no construct to acknowledge {rule} on")
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=f"AwsSolutions::{rule}", reason=reason))


def _acknowledge(hub: Hub) -> None:
    """The hub's cdk-nag findings, each with its reason."""
    _ack(
        hub.load_balancer,
        "AwsSolutions-ELB2",
        "Each request to the hub is one long-lived event stream; the hub "
        "logs every stream it opens or refuses (with tenant and task) to its log group, which is what an access "
        "log of it would say.",
    )
    _ack(
        hub.load_balancer.connections.security_groups[0],
        "AwsSolutions-EC23",
        "The hub's load balancer serves watchers on the internet (HTTPS "
        "only, port 443); every stream is authorised by an API key or an OIDC token before any event.",
    )
    _ack(
        hub.task_definition.task_role,
        f"AwsSolutions-IAM5[Resource::<{hub.payloads_id}.Arn>/{PAYLOAD_PREFIX}*]",
        f"An event stream shows committed steps, whose bodies may be offloaded under {PAYLOAD_PREFIX}<task_id>/...; "
        "the grant is GetObject on that prefix of this environment's bucket only.",
    )
    _ack(
        hub.task_definition.execution_role,
        "AwsSolutions-IAM5[Resource::*]",
        "ecr:GetAuthorizationToken "
        "supports no resource-level permission: AWS requires '*'; the image pull itself is on the image's own "
        "repository, and the log stream grant on the hub's own log group.",
    )
    _ack(
        hub.task_definition,
        "AwsSolutions-ECS2",
        "The environment holds names (table, bucket, prefix, caps) "
        "and the OIDC issuer's public settings, no secret: the hub reads API key hashes from the table.",
    )
