"""The sandbox function: where python_exec's code runs in AWS, outside the executor's trust.

The executor and the worker hold the table, the payloads, the queues, Bedrock and the
Anthropic key; model-written code must reach none of them. So it runs in a function of its
own (``functions/sandbox``) that:

- has a role granting nothing but writing its own log group and the network-interface
  actions Lambda needs to place a function in a VPC (no table, bucket, queue, secret or
  model access, and no ``lambda:*``);
- sits in isolated subnets of a VPC with no internet gateway, no NAT and no endpoints, behind
  a security group with no ingress and no egress rule: its credentials lead nowhere, because
  nothing leads anywhere;
- gets only the core layer (the handler needs the standard library and ``agentq.sandbox``);
- is invoked synchronously by the executor and the worker, whose roles may invoke this
  function and no other.

Lambda itself gives the read-only root filesystem and a microVM per environment; the handler
adds the per-call limits and cleanup (agentq.sandbox.host).
"""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.retention import removal_policy
from infra.settings import EnvironmentSettings

HANDLER = "sandbox.handler.lambda_handler"
# What Lambda does with the role to attach the function to its subnets; none of these
# actions supports resource-level permissions for the describe calls, so AWS requires "*".
VPC_ACCESS_ACTIONS = [
    "ec2:CreateNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSubnets",
    "ec2:DeleteNetworkInterface",
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
]


@dataclass
class Sandbox:
    function: lambda_.Function
    vpc: ec2.Vpc
    security_group: ec2.SecurityGroup
    log_group: logs.LogGroup

    def env(self) -> dict[str, str]:
        """What a task runner needs to send python_exec's code here (agentq.sandbox.config)."""
        return {"AGENTQ_SANDBOX": "lambda", "AGENTQ_SANDBOX_FUNCTION": self.function.function_name}

    def grant_invoke(self, principal: iam.IGrantable) -> None:
        """Invoke this function, by its exact ARN: no versions, aliases or other functions."""
        principal.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="RunSandboxedCode", actions=["lambda:InvokeFunction"], resources=[self.function.function_arn]
            )
        )


def build_sandbox(
    scope: Construct,
    cfg: EnvironmentSettings,
    *,
    code: lambda_.Code,
    core_layer: lambda_.LayerVersion,
    runtime: lambda_.Runtime,
    architecture: lambda_.Architecture,
    retention: logs.RetentionDays,
) -> Sandbox:
    s = cfg.sandbox
    removal = removal_policy(cfg)
    vpc = ec2.Vpc(
        scope,
        "SandboxVpc",
        ip_addresses=ec2.IpAddresses.cidr(s.vpc_cidr),
        max_azs=2,
        nat_gateways=0,
        subnet_configuration=[
            ec2.SubnetConfiguration(name="isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=24)
        ],
        restrict_default_security_group=False,
    )
    flow_logs = logs.LogGroup(scope, "SandboxVpcFlowLogs", retention=retention, removal_policy=removal)
    vpc.add_flow_log("FlowLogs", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs))
    security_group = ec2.SecurityGroup(
        scope,
        "SandboxSecurityGroup",
        vpc=vpc,
        allow_all_outbound=False,
        description="agentq sandbox: no ingress, no egress",
    )
    log_group = logs.LogGroup(scope, "SandboxFunctionLogs", retention=retention, removal_policy=removal)
    role = iam.Role(
        scope,
        "SandboxFunctionRole",
        assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
        description=f"agentq sandbox ({cfg.prefix}): own logs and VPC attachment only",
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="OwnLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group.log_group_arn]
        )
    )
    role.add_to_principal_policy(iam.PolicyStatement(sid="VpcAttachment", actions=VPC_ACCESS_ACTIONS, resources=["*"]))
    function = lambda_.Function(
        scope,
        "SandboxFunction",
        function_name=f"{cfg.prefix}-sandbox",
        description="agentq sandbox: runs python_exec's code, one call per invocation, with no access and no network",
        runtime=runtime,
        architecture=architecture,
        code=code,
        handler=HANDLER,
        layers=[core_layer],
        memory_size=s.memory_mb,
        timeout=cdk.Duration.seconds(s.timeout_seconds),
        ephemeral_storage_size=cdk.Size.mebibytes(s.ephemeral_storage_mb),
        reserved_concurrent_executions=s.reserved_concurrency,
        environment={
            "AGENTQ_SANDBOX_ROOT": "/tmp",
            "AGENTQ_SANDBOX_MAX_FILES": str(s.max_files),
            "AGENTQ_SANDBOX_MAX_DISK_MB": str(s.max_disk_mb),
        },
        vpc=vpc,
        vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED),
        security_groups=[security_group],
        allow_public_subnet=False,
        log_group=log_group,
        role=role,
    )
    return Sandbox(function=function, vpc=vpc, security_group=security_group, log_group=log_group)
