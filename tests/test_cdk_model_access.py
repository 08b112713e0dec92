"""The models a deployment may call and where its traces go, as the stack declares them: Bedrock
grants for exactly the configured models (``bedrock_models``), the OpenAI-compatible server's
URL for the task runners, and the ADOT collector beside the code when ``tracing.exporter`` is
``adot`` (X-Ray alone otherwise). The synths are test_cdk_stack's (one per environment, and dev
with the worker and every one of these options set)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from infra.model_access import bedrock_resource_templates
from infra.settings import deep_merge, resolve
from infra.synth import Synthesized
from infra.telemetry import ADOT_LAYER_ACCOUNT, COLLECTOR_ENDPOINT, SIDECAR_DEFAULT_CONFIG

from tests.test_cdk_stack import (
    BEDROCK_MODELS,
    CDK_CONTEXT,
    CDK_GROUP,
    ENVIRONMENTS,
    OPENAI_BASE_URL,
    ROOT,
    _as_list,
    _function,
    _role_statements,
)
from tests.test_cdk_stack import synth as synth  # the fixtures: one synth a run, whichever module asks
from tests.test_cdk_stack import synth_root as synth_root
from tests.test_cdk_stack import worker_synth as worker_synth

pytestmark = CDK_GROUP  # with the other tests that load the jsii runtime

BEDROCK_ACTIONS = {"bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"}


def _rendered(value: Any) -> str:
    """An ARN of the template with its pseudo parameters spelled ${AWS::Region} etc."""
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return "${" + str(value["Ref"]) + "}"
    glue, parts = value["Fn::Join"]
    return str(glue).join(_rendered(p) for p in parts)


def _bedrock_resources(statements: list[dict[str, Any]]) -> set[str]:
    return {
        _rendered(r)
        for s in statements
        if set(_as_list(s["Action"])) & BEDROCK_ACTIONS
        for r in _as_list(s["Resource"])
    }


def _task_role_statements(synth: Synthesized) -> list[dict[str, Any]]:
    return [
        s for r in synth.resources("AWS::IAM::Policy").values()
        if "WorkerTaskTaskRole" in json.dumps(r["Properties"]["Roles"])
        for s in r["Properties"]["PolicyDocument"]["Statement"]
    ]  # fmt: skip


def _expected(models: list[str]) -> set[str]:
    return {
        t.format(partition="${AWS::Partition}", region="${AWS::Region}", account="${AWS::AccountId}")
        for t in bedrock_resource_templates(models)
    }


def test_by_default_the_task_runners_may_invoke_claude_on_bedrock_and_nothing_else(synth: Synthesized) -> None:
    granted = _bedrock_resources(_role_statements(synth, "executor"))
    assert granted == {
        "arn:${AWS::Partition}:bedrock:${AWS::Region}::foundation-model/anthropic.*",
        "arn:${AWS::Partition}:bedrock:${AWS::Region}:${AWS::AccountId}:inference-profile/*.anthropic.*",
        "arn:${AWS::Partition}:bedrock:*::foundation-model/anthropic.*",
    }
    assert not _bedrock_resources(_role_statements(synth, "api"))  # the API calls no model


def test_the_configured_bedrock_models_are_granted_each_where_it_runs_and_no_other(worker_synth: Synthesized) -> None:
    want = {
        "arn:${AWS::Partition}:bedrock:${AWS::Region}::foundation-model/amazon.nova-pro-v1:0",
        # a cross-region profile: the profile here, its model wherever the profile routes the call
        "arn:${AWS::Partition}:bedrock:${AWS::Region}:${AWS::AccountId}:inference-profile/us.meta.llama3-3-70b-instruct-v1:0",
        "arn:${AWS::Partition}:bedrock:*::foundation-model/meta.llama3-3-70b-instruct-v1:0",
        "arn:aws:bedrock:eu-west-1:123456789012:application-inference-profile/a1b2c3d4",
    }
    assert _expected(BEDROCK_MODELS) == want
    assert _bedrock_resources(_role_statements(worker_synth, "executor")) == want
    assert _bedrock_resources(_task_role_statements(worker_synth)) == want
    actions = {a for s in _role_statements(worker_synth, "executor") for a in _as_list(s["Action"]) if "bedrock" in a}
    assert actions == BEDROCK_ACTIONS  # Converse authorises as InvokeModel, ConverseStream as ...WithResponseStream
    # cdk-nag acknowledged the one wildcard (the profile's model in every region), and only that
    suppressed = [v for v in worker_synth.validation["pluginReports"][0].get("suppressedViolations", [])
                  if "bedrock" in json.dumps(v)]  # fmt: skip
    assert suppressed and all("foundation-model/meta.llama3-3-70b" in json.dumps(v) for v in suppressed)


@pytest.mark.parametrize(
    ("models", "message"),
    [
        (["*"], "bedrock_models: '*' is not a model id"),
        (["us.*"], "bedrock_models: 'us.*' is not a model id"),
        (["anthropic.*claude"], "'*' only at the end"),
        (["amazon.nova pro"], "bedrock_models: 'amazon.nova pro'"),
    ],
)
def test_a_bedrock_model_that_would_grant_every_model_or_is_no_id_is_refused(models: list[str], message: str) -> None:
    envs = {"dev": deep_merge(ENVIRONMENTS["dev"], {"bedrock_models": models})}
    with pytest.raises(ValidationError, match=re.escape(message)):
        resolve(envs, CDK_CONTEXT.get("environment_defaults"), "dev")


def test_the_openai_base_url_reaches_the_task_runners_only(worker_synth: Synthesized) -> None:
    _, executor = _function(worker_synth, "executor")
    _, api = _function(worker_synth, "api")
    assert executor["Properties"]["Environment"]["Variables"]["OPENAI_BASE_URL"] == OPENAI_BASE_URL
    assert "OPENAI_BASE_URL" not in api["Properties"]["Environment"]["Variables"]
    (task_def,) = worker_synth.resources("AWS::ECS::TaskDefinition").values()
    worker = task_def["Properties"]["ContainerDefinitions"][0]
    assert {"Name": "OPENAI_BASE_URL", "Value": OPENAI_BASE_URL} in worker["Environment"]


def test_traces_go_to_xray_alone_unless_adot_is_chosen(synth: Synthesized) -> None:
    for resource in synth.resources("AWS::Lambda::Function").values():
        props = resource["Properties"]
        assert not any(k.startswith("OTEL_") for k in props.get("Environment", {}).get("Variables", {}))
        assert ADOT_LAYER_ACCOUNT not in json.dumps(props.get("Layers", []))
    assert not [r for r in synth.resources("AWS::Lambda::LayerVersion").values()
                if "OpenTelemetry" in r["Properties"]["Description"]]  # fmt: skip
    _, executor = _function(synth, "executor")
    assert executor["Properties"]["TracingConfig"] == {"Mode": "Active"}


def test_adot_puts_a_collector_beside_the_executor_and_the_worker(worker_synth: Synthesized) -> None:
    for name in ("executor",):
        _, fn = _function(worker_synth, name)
        props = fn["Properties"]
        env = props["Environment"]["Variables"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == COLLECTOR_ENDPOINT
        assert env["OTEL_SERVICE_NAME"] == f"agentq-{name}"
        assert "OPENTELEMETRY_COLLECTOR_CONFIG_URI" not in env  # ADOT's own configuration: X-Ray
        layers = [_rendered(layer) for layer in props["Layers"] if not isinstance(layer, dict) or "Ref" not in layer]
        otel = [lid for lid, r in worker_synth.resources("AWS::Lambda::LayerVersion").items()
                if "OpenTelemetry" in r["Properties"]["Description"]]  # fmt: skip
        assert len(otel) == 1 and {"Ref": otel[0]} in props["Layers"]  # the SDK the spans leave through
        assert layers == [
            f"arn:${{AWS::Partition}}:lambda:${{AWS::Region}}:{ADOT_LAYER_ACCOUNT}:layer:aws-otel-collector-arm64-ver-0-117-0:1"
        ]
        assert props["TracingConfig"] == {"Mode": "Active"}  # X-Ray segments as before
    for name in ("api", "authorizer", "reaper"):  # they run no engine, so emit no OpenTelemetry spans
        _, fn = _function(worker_synth, name)
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in fn["Properties"]["Environment"]["Variables"]
        assert ADOT_LAYER_ACCOUNT not in json.dumps(fn["Properties"]["Layers"])
    (task_def,) = worker_synth.resources("AWS::ECS::TaskDefinition").values()
    worker, collector = task_def["Properties"]["ContainerDefinitions"]
    assert {"Name": "OTEL_EXPORTER_OTLP_ENDPOINT", "Value": COLLECTOR_ENDPOINT} in worker["Environment"]
    assert worker["DependsOn"] == [{"ContainerName": collector["Name"], "Condition": "START"}]
    assert collector["Image"].startswith("public.ecr.aws/aws-observability/aws-otel-collector:v")
    assert collector["Command"] == [f"--config={SIDECAR_DEFAULT_CONFIG}"]
    assert collector["Essential"] is False  # a collector gone drops spans, never tasks
    assert collector["LogConfiguration"]["LogDriver"] == "awslogs"
    assert collector["LinuxParameters"]["Capabilities"] == {"Drop": ["ALL"]}
    assert 'ARG AGENTQ_EXTRAS=""' in (ROOT / "Dockerfile").read_text()  # CDK builds it with otel when adot
    xray = [s for s in _task_role_statements(worker_synth) if "xray:PutTraceSegments" in _as_list(s["Action"])]
    assert len(xray) == 1 and sorted(_as_list(xray[0]["Action"])) == [
        "xray:PutTelemetryRecords",
        "xray:PutTraceSegments",
    ]
