"""A Fargate task definition as every service of the stack wants it: the environment's CPU
architecture (``architecture``: arm64 unless set) on Linux, so the worker and the events hub run
on the same platform their image was built for, named once here."""

from __future__ import annotations

from aws_cdk import aws_ecs as ecs
from constructs import Construct

from infra.settings import EnvironmentSettings


def fargate_task_definition(
    scope: Construct, construct_id: str, cfg: EnvironmentSettings, *, cpu: int, memory_mb: int
) -> ecs.FargateTaskDefinition:
    arm = cfg.architecture == "arm64"
    return ecs.FargateTaskDefinition(
        scope,
        construct_id,
        cpu=cpu,
        memory_limit_mib=memory_mb,
        runtime_platform=ecs.RuntimePlatform(
            cpu_architecture=ecs.CpuArchitecture.ARM64 if arm else ecs.CpuArchitecture.X86_64,
            operating_system_family=ecs.OperatingSystemFamily.LINUX,
        ),
    )
