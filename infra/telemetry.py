"""OpenTelemetry out of AWS (``tracing`` in cdk.json): X-Ray stays the default; with
``tracing.exporter = "adot"`` the executor gets ADOT's collector as a Lambda layer (an
extension listening on localhost:4318) and the Fargate worker a collector sidecar in its task
(awsvpc: the same localhost), and both ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing there, which is
what switches ``agentq.observe.otel`` on. Only what runs the engine emits spans (task, step,
model and tool calls); the API, authorizer and the rest get no collector, which would only add
to their cold starts. The OpenTelemetry SDK goes with the option (a layer of its own, built from
``layers/otel-requirements.txt``; ``agentq[otel]`` in the worker image CDK builds), so a stack
without it carries none of it. The collector forwards the spans where its configuration says:
ADOT's default sends them to X-Ray; ``tracing.collector_config`` names another (Honeycomb,
Datadog, Langfuse: any OTLP backend).

Lambda's active tracing stays on either way, so the X-Ray segments and alarms do not depend on
the option.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.build_layers import ROOT, build_deps_layer
from infra.layers import BUILT_MARKER_EXCLUDES, RUNTIME, architecture, require_built
from infra.settings import ADOT_COLLECTOR_LAYER, EnvironmentSettings

COLLECTOR_ENDPOINT = "http://localhost:4318"  # the collector's OTLP/HTTP receiver, beside the code
ADOT_LAYER_ACCOUNT = "901920570463"  # AWS publishes the ADOT Lambda layers from this account
SIDECAR_DEFAULT_CONFIG = "/etc/ecs/ecs-xray.yaml"  # in the collector image: OTLP in, X-Ray out
XRAY_ACTIONS = ["xray:PutTraceSegments", "xray:PutTelemetryRecords"]
OTEL_REQUIREMENTS = ROOT / "layers" / "otel-requirements.txt"


def adot(cfg: EnvironmentSettings) -> bool:
    return cfg.tracing.exporter == "adot"


def otel_env(cfg: EnvironmentSettings, service: str) -> dict[str, str]:
    """What makes the code export spans to the collector next to it; nothing when X-Ray only."""
    if not adot(cfg):
        return {}
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": COLLECTOR_ENDPOINT,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": service,
    }


def lambda_collector(scope: Construct, cfg: EnvironmentSettings) -> tuple[list[lambda_.ILayerVersion], dict[str, str]]:
    """The OpenTelemetry SDK's layer (the deps layer does without it: pyproject's ``otel``
    extra), the collector layer, and the variables that configure them; none when X-Ray only."""
    if not adot(cfg):
        return [], {}
    built = require_built(
        scope,
        build_deps_layer(cfg.architecture, requirements=OTEL_REQUIREMENTS),
        "tracing.exporter = adot needs the OpenTelemetry layer built.",
    )
    sdk = lambda_.LayerVersion(
        scope,
        "OtelLayer",
        code=lambda_.Code.from_asset(str(built.path), exclude=BUILT_MARKER_EXCLUDES),
        compatible_runtimes=[RUNTIME],
        compatible_architectures=[architecture(cfg)],
        description="OpenTelemetry SDK and OTLP/HTTP exporter (layers/otel-requirements.txt)",
    )
    arch = "arm64" if cfg.architecture == "arm64" else "amd64"
    arn = cfg.tracing.collector_layer_arn or (
        f"arn:{cdk.Aws.PARTITION}:lambda:{cdk.Aws.REGION}:{ADOT_LAYER_ACCOUNT}:layer:"
        + ADOT_COLLECTOR_LAYER.format(arch=arch)
    )
    layer = lambda_.LayerVersion.from_layer_version_arn(scope, "AdotCollectorLayer", arn)
    env = {"OPENTELEMETRY_COLLECTOR_CONFIG_URI": cfg.tracing.collector_config} if cfg.tracing.collector_config else {}
    return [sdk, layer], env


def add_collector_sidecar(
    task_def: ecs.FargateTaskDefinition,
    worker: ecs.ContainerDefinition,
    cfg: EnvironmentSettings,
    logs_group: logs.ILogGroup,
) -> ecs.ContainerDefinition | None:
    """The collector container beside the worker (started first), and the task role's X-Ray
    grant for ADOT's default configuration. None when X-Ray only."""
    if not adot(cfg):
        return None
    config = cfg.tracing.collector_config or SIDECAR_DEFAULT_CONFIG
    linux = ecs.LinuxParameters(task_def, "CollectorLinuxParameters")
    linux.drop_capabilities(ecs.Capability.ALL)  # it receives on localhost and sends out: no capability needed
    collector = task_def.add_container(
        "otel-collector",
        image=ecs.ContainerImage.from_registry(cfg.tracing.collector_image),
        command=[f"--config={config}"],
        essential=False,  # no collector: spans are dropped, tasks still run
        memory_reservation_mib=128,
        logging=ecs.LogDrivers.aws_logs(stream_prefix="otel-collector", log_group=logs_group),
        linux_parameters=linux,
    )
    worker.add_container_dependencies(
        ecs.ContainerDependency(container=collector, condition=ecs.ContainerDependencyCondition.START)
    )
    task_def.task_role.add_to_principal_policy(
        iam.PolicyStatement(sid="CollectorToXRay", actions=XRAY_ACTIONS, resources=["*"])
    )
    return collector
