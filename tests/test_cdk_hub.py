"""The events hub in the stack (infra/hub.py): dev with ``live.hub`` on. Its capacity is its own
(a service, cluster and VPC apart from the executors' reserved concurrency and the worker's), its
role reads the table, its stream and the payloads and writes nothing, the API names it, its
failures alarm, and cdk-nag and cfn-lint pass. The shipped environments' SSE function has a
reserved concurrency of its own too."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.synth import Synthesized, synthesize

from tests import test_cdk_stack as stack
from tests.test_cdk_stack import (
    CFN_LINT,
    ENVIRONMENTS,
    _actions,
    _alarms,
    _alarms_off_the_dashboard,
    _function,
    documented_alarms,
    settings_of,
)

synth_root = stack.synth_root
synth = stack.synth

CERT = "arn:aws:acm:us-east-1:123456789012:certificate/00000000-0000-0000-0000-000000000000"
DOMAIN = "events.example.com"
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems", "PartiQLUpdate",
          "PartiQLInsert", "PartiQLDelete"}  # fmt: skip


def _hub_context() -> dict[str, Any]:
    dev = json.loads(json.dumps(ENVIRONMENTS["dev"]))
    dev["live"] = {**dev.get("live", {}), "hub": True, "hub_domain": DOMAIN, "hub_certificate_arn": CERT}
    return {"environments": {**ENVIRONMENTS, "dev": dev}}


@pytest.fixture(scope="module")
def hub_synth(synth_root: Path) -> Synthesized:
    return synthesize("dev", synth_root / "dev-hub", context=_hub_context())


def _hub_role_statements(synth: Synthesized) -> list[dict[str, Any]]:
    [(_, task)] = [(lid, r) for lid, r in synth.resources("AWS::ECS::TaskDefinition").items()
                   if r["Properties"]["ContainerDefinitions"][0]["Name"] == "hub"]  # fmt: skip
    role = task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0]
    return [s for p in synth.resources("AWS::IAM::Policy").values() if {"Ref": role} in p["Properties"]["Roles"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]]  # fmt: skip


def test_the_sse_function_has_reserved_concurrency_of_its_own_never_the_executors(synth: Synthesized) -> None:
    cfg = settings_of(synth.env_name)
    sse = _function(synth, "events")[1]["Properties"].get("ReservedConcurrentExecutions")
    executor = _function(synth, "executor")[1]["Properties"].get("ReservedConcurrentExecutions")
    assert sse == cfg.live.sse_reserved_concurrency and executor == cfg.executor.reserved_concurrency
    assert isinstance(sse, int) and isinstance(executor, int) and sse >= 1  # two reservations, apart


def test_the_hub_runs_on_capacity_of_its_own_and_the_api_names_it(hub_synth: Synthesized) -> None:
    services = hub_synth.resources("AWS::ECS::Service")
    [(_, service)] = [(k, v) for k, v in services.items() if "Hub" in k]
    props = service["Properties"]
    assert props["DesiredCount"] == 1 and props["LaunchType"] == "FARGATE"
    # never a second server (with the reaper, a third reader of a stream shard), even during a
    # deployment; ECS rounds the minimum up, so only 0% lets a deployment of one server proceed
    assert props["DeploymentConfiguration"]["MaximumPercent"] == 100
    assert props["DeploymentConfiguration"]["MinimumHealthyPercent"] == 0
    clusters = hub_synth.resources("AWS::ECS::Cluster")
    assert props["Cluster"]["Ref"] in clusters and "Hub" in props["Cluster"]["Ref"]
    # Nothing of the executors' changes with the hub: their reservation is the same as without it.
    cfg = settings_of("dev")
    executor = _function(hub_synth, "executor")[1]["Properties"].get("ReservedConcurrentExecutions")
    assert executor == cfg.executor.reserved_concurrency
    api_env = _function(hub_synth, "api")[1]["Properties"]["Environment"]["Variables"]
    assert api_env["AGENTQ_EVENTS_HUB_URL"] == f"https://{DOMAIN}"
    [task] = [r for r in hub_synth.resources("AWS::ECS::TaskDefinition").values()
              if r["Properties"]["ContainerDefinitions"][0]["Name"] == "hub"]  # fmt: skip
    container = task["Properties"]["ContainerDefinitions"][0]
    assert container["Command"] == ["python", "-m", "agentq.hub"] and container["ReadonlyRootFilesystem"]
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert env["AGENTQ_HUB_STREAMS_PER_TENANT"] == str(cfg.live.streams_per_tenant)  # one server holds them all
    assert env["AGENTQ_AUTHORIZER_CACHE_SECONDS"] == str(cfg.api.authorizer_cache_seconds)  # streams authorised again
    listeners = hub_synth.resources("AWS::ElasticLoadBalancingV2::Listener")
    assert [lst["Properties"]["Protocol"] for lst in listeners.values()] == ["HTTPS"]


def test_the_table_stream_has_at_most_two_readers_with_the_hub_on(hub_synth: Synthesized) -> None:
    """DynamoDB Streams throttles more than two processes reading a shard at once; every hub
    server reads every shard, and so does the reaper's event source mapping."""
    resources = hub_synth.template["Resources"]
    mappings = [r for r in resources.values() if r["Type"] == "AWS::Lambda::EventSourceMapping"
                and "StreamArn" in json.dumps(r["Properties"]["EventSourceArn"])]  # fmt: skip
    hub = [
        r["Properties"] for lid, r in resources.items() if r["Type"] == "AWS::ECS::Service" and lid.startswith("Hub")
    ]
    (servers,) = [h["DesiredCount"] * h["DeploymentConfiguration"]["MaximumPercent"] // 100 for h in hub]
    assert len(mappings) == 1 and len(mappings) + servers <= 2, f"{len(mappings)} mapping(s) + {servers} hub server(s)"


def test_more_hub_servers_than_the_stream_has_readers_left_are_refused_naming_the_field() -> None:
    from infra.live_settings import LiveSettings

    with pytest.raises(ValueError, match=r"live\.hub_tasks must be at most 1: .*the reaper's event source mapping"):
        LiveSettings(hub=True, hub_domain=DOMAIN, hub_certificate_arn=CERT, hub_tasks=2)


def test_the_hub_reads_the_table_and_its_stream_and_writes_nothing(hub_synth: Synthesized) -> None:
    actions = _actions(_hub_role_statements(hub_synth))
    assert {"dynamodb:GetItem", "dynamodb:Query", "dynamodb:DescribeStream", "dynamodb:GetRecords",
            "dynamodb:GetShardIterator"} <= actions  # fmt: skip
    assert not {a for a in actions if a.split(":")[1] in WRITES or a.endswith("*")}
    assert not {a for a in actions if a.startswith(("s3:Put", "s3:Delete", "sqs:", "states:", "lambda:"))}


def test_the_hubs_failures_alarm(hub_synth: Synthesized) -> None:
    alarms = _alarms(hub_synth)
    prefix = settings_of("dev").prefix
    for name in ("hub-server-5xx", "hub-load-balancer-5xx", "hub-unhealthy-hosts", "hub-rejected-connections"):
        assert f"{prefix}-{name}" in alarms, sorted(a for a in alarms if "hub" in a)


def test_the_dashboards_alarm_widget_shows_the_hubs_alarms(hub_synth: Synthesized) -> None:
    assert _alarms_off_the_dashboard(hub_synth) == []


def test_the_hubs_alarms_are_in_deploy_md_by_their_names(hub_synth: Synthesized) -> None:
    documented = documented_alarms(settings_of("dev").prefix)
    assert sorted(set(_alarms(hub_synth)) - documented) == []


def test_the_hub_passes_cdk_nag_and_cfn_lint(hub_synth: Synthesized) -> None:
    reports = {r["pluginName"]: r for r in hub_synth.validation["pluginReports"]}
    assert reports["AwsSolutions"]["conclusion"] == "success" and reports["AwsSolutions"]["violations"] == []
    proc = subprocess.run([*CFN_LINT, "--", str(hub_synth.template_path)],
                          capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_hub_without_https_is_refused_at_synth() -> None:
    from infra.live_settings import LiveSettings

    with pytest.raises(ValueError, match=r"hub_domain and live\.hub_certificate_arn"):
        LiveSettings(hub=True, hub_domain=DOMAIN)
