"""The EC2 workspace tier in the synthesized stack (``infra/workspace_tier.py``), pinned on the
templates of the environments of cdk.json with it (staging, prod), of those without it (dev:
nothing of it there), and of dev with both the Fargate worker and the tier.

- Opt-in per environment (``workspace.tier``): off in dev, where an environment without it has no
  workspace queues, no instance and no routing variable.
- The launch template: Amazon Linux 2023 for the stack's architecture, IMDSv2 required with a hop
  limit of 1, no public IP, an encrypted root volume; the group in the private subnets, between the
  environment's min and max, scaled on the workspace pool's backlog.
- What the instances run: the unit of ``infra/workspace_unit.py`` with the environment's worker
  options (the unit ``tests/test_workspace_tier_unit.py`` runs), on the workspace pool, bubblewrap
  from the distribution, agentq from the stack's own assets.
- Least privilege: the role receives only from the workspace queues, reaches objects only under the
  payload bucket's ``tasks/`` and its own artifacts (by exact key, GetObject), writes only its log
  group; no ingress, egress 443/80. It is denied every task's workspace objects (IAM's evaluation
  over task id shapes) and reaches them only through the workspace objects role, trusted by it
  alone, holding Get/Put of workspace objects only, assumed per task with a session policy
  (``agentq.storage.workspace_access``, tests/test_workspace_access.py).
- Scale-in: a termination lifecycle hook (CONTINUE after ``DRAIN_SECONDS``) the worker completes
  on its own group only, named to the worker by its environment; a drained worker not restarted.
- Routing: the API, the executor and the Fargate worker know the pool and may send to it; the
  fan-out machine may send to it the children and the wake of a spawn from the tier's worker.
- Alarms: each workspace queue starved (visible messages, not age), each workspace DLQ, and a
  worker that could not sandbox (a metric filter on its ``sandbox_unavailable`` line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from agentq.queueing.queues import POOL_VARIABLE, WORKSPACE_POOL, WORKSPACE_POOL_VARIABLE
from agentq.resources import PAYLOAD_PREFIX, TIERS
from infra import workspace_unit as unit
from infra.settings import EnvironmentSettings
from infra.synth import Synthesized, synthesize

from tests.test_cdk_stack import (
    CDK_GROUP,
    ENVIRONMENTS,
    _as_list,
    _function,
    _statements_of_role,
    _worker_context,
    settings_of,
    synth_subnet_is_private,
)
from tests.test_cdk_stack import synth_root as synth_root  # the fixture: one synth a run, whichever module asks

pytestmark = CDK_GROUP
WITH_TIER = [e for e in ENVIRONMENTS if settings_of(e).workspace.tier == "ec2"]
WITHOUT_TIER = [e for e in ENVIRONMENTS if e not in WITH_TIER]


@pytest.fixture(scope="module", params=WITH_TIER)
def synth(request: pytest.FixtureRequest, synth_root: Path) -> Synthesized:
    """Each environment of cdk.json that has the tier (the same synth tests/test_cdk_stack.py makes)."""
    return synthesize(request.param, synth_root / request.param)


@pytest.fixture(scope="module", params=WITHOUT_TIER)
def plain_synth(request: pytest.FixtureRequest, synth_root: Path) -> Synthesized:
    return synthesize(request.param, synth_root / request.param)


@pytest.fixture(scope="module")
def both_synth(synth_root: Path) -> Synthesized:
    """dev with the Fargate worker and the EC2 tier both on."""
    context = _worker_context()
    dev = context["environments"]["dev"]
    dev["workspace"] = {**dev.get("workspace", {}), "tier": "ec2", "ec2": {"min_instances": 1, "max_instances": 3}}
    return synthesize("dev", synth_root / "dev-worker-ec2", context=context)


def _cfg(synth: Synthesized) -> EnvironmentSettings:
    return settings_of(synth.env_name)


def _one_of(synth: Synthesized, type_: str) -> tuple[str, dict[str, Any]]:
    found = list(synth.resources(type_).items())
    assert len(found) == 1, f"expected one {type_}, found {len(found)}"
    return found[0]


def _user_data(synth: Synthesized) -> str:
    """The launch template's user data with every CloudFormation reference shown as <ref>."""
    _, lt = _one_of(synth, "AWS::EC2::LaunchTemplate")
    parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else "<ref>" for p in parts)


def _tier_role(synth: Synthesized) -> str:
    (role,) = [
        lid for lid, r in synth.resources("AWS::IAM::Role").items()
        if "ec2.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    ]  # fmt: skip
    return role


def _workspace_queue_ids(synth: Synthesized) -> dict[str, str]:
    prefix = _cfg(synth).prefix
    return {
        r["Properties"]["QueueName"]: lid for lid, r in synth.resources("AWS::SQS::Queue").items()
        if r["Properties"]["QueueName"].startswith(f"{prefix}-{WORKSPACE_POOL}-")
    }  # fmt: skip


def test_the_tier_is_opt_in_per_environment_and_off_in_dev() -> None:
    assert settings_of("dev").workspace.tier == "none"
    assert {e for e in ENVIRONMENTS if settings_of(e).workspace.tier == "ec2"} == {"staging", "prod"}


def test_an_environment_without_the_tier_has_no_workspace_queue_instance_or_routing(plain_synth: Synthesized) -> None:
    synth = plain_synth
    assert _cfg(synth).workspace.tier != "ec2"
    assert not _workspace_queue_ids(synth)
    assert not synth.resources("AWS::AutoScaling::AutoScalingGroup")
    assert not synth.resources("AWS::EC2::LaunchTemplate")
    assert not synth.resources("AWS::AutoScaling::LifecycleHook")
    for name in ("api", "executor"):
        _, fn = _function(synth, name)
        assert WORKSPACE_POOL_VARIABLE not in fn["Properties"]["Environment"]["Variables"]


def test_the_launch_template_requires_imdsv2_with_hop_limit_1_no_public_ip_and_an_encrypted_root(
    synth: Synthesized,
) -> None:
    cfg = _cfg(synth)
    _, lt = _one_of(synth, "AWS::EC2::LaunchTemplate")
    data = lt["Properties"]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1  # a container or a sandbox one hop away gets nothing
    assert data["MetadataOptions"].get("HttpEndpoint", "enabled") == "enabled"  # the worker's own credentials
    (nic,) = data["NetworkInterfaces"]
    assert nic["AssociatePublicIpAddress"] is False
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"] == {"DeleteOnTermination": True, "Encrypted": True, "VolumeSize": cfg.workspace.ec2.root_volume_gb,
                           "VolumeType": "gp3"}  # fmt: skip
    assert data["InstanceType"] == cfg.workspace.ec2.instance_type
    image = synth.template["Parameters"][data["ImageId"]["Ref"]]["Default"]
    arch = "arm64" if cfg.architecture == "arm64" else "x86_64"
    assert image.startswith("/aws/service/ami-amazon-linux-latest/al2023-ami-") and image.endswith(arch)


def test_the_group_runs_in_private_subnets_between_the_environments_bounds_scaled_on_the_workspace_backlog(
    synth: Synthesized,
) -> None:
    cfg = _cfg(synth)
    _, group = _one_of(synth, "AWS::AutoScaling::AutoScalingGroup")
    props = group["Properties"]
    assert (props["MinSize"], props["MaxSize"]) == (
        str(cfg.workspace.ec2.min_instances),
        str(cfg.workspace.ec2.max_instances),
    )
    assert all(synth_subnet_is_private(synth, s["Ref"]) for s in props["VPCZoneIdentifier"])
    policies = [p["Properties"] for p in synth.resources("AWS::AutoScaling::ScalingPolicy").values()]
    assert policies and all(p["PolicyType"] == "StepScaling" for p in policies)
    queues = set(_workspace_queue_ids(synth).values())
    scale_alarms = [
        a["Properties"] for a in synth.resources("AWS::CloudWatch::Alarm").values()
        if "ApproximateNumberOfMessagesNotVisible" in json.dumps(a["Properties"].get("Metrics", []))
        and any(q in json.dumps(a["Properties"]["Metrics"]) for q in queues)
    ]  # fmt: skip
    assert len(scale_alarms) == 2  # out and in, on the workspace pool's waiting + in flight


def test_the_instances_run_the_units_worker_on_the_workspace_pool_with_bubblewrap_from_the_distribution(
    synth: Synthesized,
) -> None:
    cfg = _cfg(synth)
    script = _user_data(synth)
    args = unit.worker_args(
        concurrency=cfg.workspace.ec2.concurrency, heartbeat=cfg.worker.heartbeat_seconds,
        lease=cfg.worker.lease_seconds, visibility=cfg.worker.visibility_seconds, max_receive_count=cfg.max_receive_count,
    )  # fmt: skip
    assert unit.unit(args) in script  # the very unit tests/test_workspace_tier_unit.py runs
    assert script.startswith("#!/bin/bash\nset -euo pipefail\n")
    assert "dnf install -y bubblewrap python3.12" in script
    for name in ("core", "deps", "boto"):  # the stack's own assets, fetched before anything unpacks them
        assert script.index(f"/tmp/agentq-{name}.zip'") < script.index(f"unzip -q -o /tmp/agentq-{name}.zip")
    env = unit.parse_environment_file(script.split("<<'AGENTQ_ENV'\n")[1].split("AGENTQ_ENV\n")[0])
    assert env[POOL_VARIABLE] == env[WORKSPACE_POOL_VARIABLE] == WORKSPACE_POOL
    assert env["AGENTQ_SANDBOX"] == "bwrap" and "AGENTQ_SANDBOX_FUNCTION" not in env
    assert env["AGENTQ_WORKSPACE_ROOT"] == unit.WORKSPACE_ROOT
    assert env["AGENTQ_WORKSPACE_MAX_BYTES"] == str(cfg.workspace.max_bytes)


def _object_resources(statements: list[dict[str, Any]]) -> list[tuple[set[str], str]]:
    return [
        (set(_as_list(s["Action"])), json.dumps(r, sort_keys=True))
        for s in statements if any(a.startswith("s3:") for a in _as_list(s["Action"]))
        for r in _as_list(s["Resource"])
    ]  # fmt: skip


def test_the_tier_role_receives_only_its_queues_and_reaches_only_tasks_objects_its_artifacts_and_its_logs(
    synth: Synthesized,
) -> None:
    statements = _statements_of_role(synth, _tier_role(synth))
    assert [s.get("Sid") for s in statements if s.get("Effect") == "Deny"] == ["NoWorkspaceObjects"]
    workspace = {lid for name, lid in _workspace_queue_ids(synth).items() if not name.endswith("-dlq")}
    receive = [s for s in statements if "sqs:ReceiveMessage" in _as_list(s["Action"])]
    assert receive and all(r["Fn::GetAtt"][0] in workspace for s in receive for r in _as_list(s["Resource"]))
    bucket = _payload_bucket(synth)
    artifacts = next(s for s in statements if s.get("Sid") == "WorkerArtifacts")
    assert _as_list(artifacts["Action"]) == ["s3:GetObject"] and len(_as_list(artifacts["Resource"])) == 3
    for resource in _as_list(artifacts["Resource"]):  # an exact asset object each: <assets bucket>/<hash>.zip
        assert json.dumps(resource).endswith('.zip"]]}') and "*" not in json.dumps(resource).split("/")[-1]
    for actions, resource in _object_resources([s for s in statements if s is not artifacts]):
        assert actions <= {"s3:GetObject", "s3:PutObject"}, actions
        assert bucket in resource and f'"/{PAYLOAD_PREFIX}*' in resource, resource
    logs = [s for s in statements if any(a.startswith("logs:") for a in _as_list(s["Action"]))]
    (group,) = synth.resources("AWS::Logs::LogGroup").keys() & {
        r["Fn::GetAtt"][0] for s in logs for r in _as_list(s["Resource"]) if isinstance(r, dict) and "Fn::GetAtt" in r
    }
    assert "WorkspaceWorkerLogs" in group
    services = {a.split(":")[0] for s in statements for a in _as_list(s["Action"])}
    assert not services & {"ec2", "iam", "ssm", "ecs", "lambda"}  # python_exec: bwrap here
    # sts and autoscaling: one action each, on one resource of its own (tests below)
    assert {a for s in statements for a in _as_list(s["Action"]) if a.split(":")[0] in ("sts", "autoscaling")} == {
        "sts:AssumeRole", "autoscaling:CompleteLifecycleAction"}  # fmt: skip


def _rendered(resource: Any, names: dict[str, str]) -> str:
    """A resource as a string: ``{"Fn::GetAtt": [id, "Arn"]}`` as ``names[id]`` (else <id>)."""
    if isinstance(resource, str):
        return resource
    if "Fn::GetAtt" in resource:
        return names.get(resource["Fn::GetAtt"][0], f"<{resource['Fn::GetAtt'][0]}>")
    if "Fn::Join" in resource:
        return str(resource["Fn::Join"][0]).join(_rendered(p, names) for p in resource["Fn::Join"][1])
    return f"<{next(iter(resource))}>"


def _decides(statements: list[dict[str, Any]], action: str, arn: str, names: dict[str, str]) -> str:
    """IAM's evaluation of identity statements: an explicit Deny wins, else an Allow, else implicit deny."""
    import re

    def matches(s: dict[str, Any]) -> bool:
        patterns = [_rendered(r, names) for r in _as_list(s["Resource"])]
        return action in _as_list(s["Action"]) and any(
            re.fullmatch("".join(".*" if c == "*" else re.escape(c) for c in p), arn) for p in patterns
        )

    if any(s.get("Effect") == "Deny" and matches(s) for s in statements):
        return "deny"
    return "allow" if any(s.get("Effect", "Allow") == "Allow" and matches(s) for s in statements) else "implicit"


def _payload_bucket(synth: Synthesized) -> str:
    (bucket,) = [
        lid for lid, b in synth.resources("AWS::S3::Bucket").items()
        if b["Properties"].get("LoggingConfiguration", {}).get("LogFilePrefix") == "payloads/"
    ]  # fmt: skip
    return bucket


def _objects_role(synth: Synthesized) -> str:
    (role,) = [lid for lid in synth.resources("AWS::IAM::Role") if lid.startswith("WorkspaceObjectsRole")]
    return role


TASK_KEYS = ["0123456789abcdef0123456789abcdef", "a", "caller-chosen_ID-" + "x" * 100]


@pytest.mark.parametrize("task", TASK_KEYS)
def test_the_instance_role_itself_may_not_read_or_write_any_tasks_workspace_objects(
    synth: Synthesized, task: str
) -> None:
    statements = _statements_of_role(synth, _tier_role(synth))
    names = {_payload_bucket(synth): "BUCKET"}
    for action in ("s3:GetObject", "s3:PutObject"):
        for key in (f"tasks/{task}/workspace/blobs/{'a' * 64}", f"tasks/{task}/workspace/manifests/{'b' * 64}",
                    "tasks/.uploads/acme/workspace/blobs/c"):  # fmt: skip
            assert _decides(statements, action, f"BUCKET/{key}", names) == "deny", (action, key)
        # the rest of a task's payloads stay a task runner's
        assert _decides(statements, action, f"BUCKET/tasks/{task}/steps/000001-e1.json", names) == "allow", action


def test_the_workspace_objects_role_is_assumable_by_the_instance_role_only_and_holds_only_workspace_objects(
    synth: Synthesized,
) -> None:
    from agentq.storage.workspace_access import DURATION_SECONDS, ROLE_VARIABLE

    instance, objects = _tier_role(synth), _objects_role(synth)
    role = synth.template["Resources"][objects]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Action"] == "sts:AssumeRole" and trust["Effect"] == "Allow"
    assert trust["Principal"] == {"AWS": {"Fn::GetAtt": [instance, "Arn"]}}
    assert role["MaxSessionDuration"] == DURATION_SECONDS and "ManagedPolicyArns" not in role
    (grant,) = _statements_of_role(synth, objects)
    bucket = _payload_bucket(synth)
    assert (grant["Effect"], sorted(_as_list(grant["Action"]))) == ("Allow", ["s3:GetObject", "s3:PutObject"])
    assert _as_list(grant["Resource"]) == [
        {"Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, "/tasks/*/workspace/*"]]}
    ]
    (assume,) = [s for s in _statements_of_role(synth, instance) if "sts:AssumeRole" in _as_list(s["Action"])]
    assert _as_list(assume["Resource"]) == [{"Fn::GetAtt": [objects, "Arn"]}]
    # the worker is told which role to assume: the variable's value in the user data is this role's ARN
    _, lt = _one_of(synth, "AWS::EC2::LaunchTemplate")
    parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    (at,) = [i for i, p in enumerate(parts) if isinstance(p, str) and p.endswith(f'{ROLE_VARIABLE}="')]
    assert parts[at + 1] == {"Fn::GetAtt": [objects, "Arn"]}


def test_scale_in_waits_on_a_termination_hook_the_worker_completes_for_its_own_group_only(synth: Synthesized) -> None:
    cfg = _cfg(synth)
    (hook,) = synth.resources("AWS::AutoScaling::LifecycleHook").values()
    props = hook["Properties"]
    group_id, _ = _one_of(synth, "AWS::AutoScaling::AutoScalingGroup")
    assert props["AutoScalingGroupName"] == {"Ref": group_id}
    assert props["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert (props["HeartbeatTimeout"], props["DefaultResult"]) == (unit.DRAIN_SECONDS, "CONTINUE")
    assert props["LifecycleHookName"] == unit.lifecycle_hook_name(cfg.prefix)
    assert unit.DRAIN_SECONDS > unit.STOP_TIMEOUT_SECONDS  # the drain's wait outlasts a stop's
    (complete,) = [s for s in _statements_of_role(synth, _tier_role(synth))
                   if "autoscaling:CompleteLifecycleAction" in _as_list(s["Action"])]  # fmt: skip
    assert _as_list(complete["Action"]) == ["autoscaling:CompleteLifecycleAction"]
    (resource,) = _as_list(complete["Resource"])
    assert _rendered(resource, {}).endswith(f":autoScalingGroup:*:autoScalingGroupName/{unit.group_name(cfg.prefix)}")
    env = unit.parse_environment_file(_user_data(synth).split("<<'AGENTQ_ENV'\n")[1].split("AGENTQ_ENV\n")[0])
    assert env[unit.HOOK_VARIABLE] == props["LifecycleHookName"]
    assert env[unit.GROUP_VARIABLE] == unit.group_name(cfg.prefix) == _one_of(
        synth, "AWS::AutoScaling::AutoScalingGroup")[1]["Properties"]["AutoScalingGroupName"]  # fmt: skip
    assert f"RestartPreventExitStatus={unit.TERMINATING_EXIT}" in _user_data(synth)  # drained: not restarted


def test_the_tier_has_no_ingress_and_leaves_only_on_https_and_http(synth: Synthesized) -> None:
    (sg,) = [r["Properties"] for r in synth.resources("AWS::EC2::SecurityGroup").values()
             if "workspace tier" in r["Properties"]["GroupDescription"]]  # fmt: skip
    assert "SecurityGroupIngress" not in sg
    assert sorted((e["IpProtocol"], e["FromPort"], e["ToPort"]) for e in sg["SecurityGroupEgress"]) == [
        ("tcp", 80, 80), ("tcp", 443, 443),
    ]  # fmt: skip


def _routes(synth: Synthesized, role_id: str) -> bool:
    """The role may send to every workspace queue (statements may be merged: minimizePolicies)."""
    workspace = {lid for name, lid in _workspace_queue_ids(synth).items() if not name.endswith("-dlq")}
    sends = {
        r["Fn::GetAtt"][0] for s in _statements_of_role(synth, role_id) if "sqs:SendMessage" in _as_list(s["Action"])
        for r in _as_list(s["Resource"]) if isinstance(r, dict) and "Fn::GetAtt" in r
    }  # fmt: skip
    return bool(workspace) and workspace <= sends


def test_the_api_the_executor_and_the_fargate_worker_route_workspace_tasks_to_the_pool(both_synth: Synthesized) -> None:
    for name in ("api", "executor"):
        _, fn = _function(both_synth, name)
        assert fn["Properties"]["Environment"]["Variables"][WORKSPACE_POOL_VARIABLE] == WORKSPACE_POOL
        assert POOL_VARIABLE not in fn["Properties"]["Environment"]["Variables"]  # they read the default queues
        assert _routes(both_synth, fn["Properties"]["Role"]["Fn::GetAtt"][0]), name
    (task,) = both_synth.resources("AWS::ECS::TaskDefinition").values()
    (worker,) = [c for c in task["Properties"]["ContainerDefinitions"] if c.get("Command", [""])[0] == "agentq"]
    assert {"Name": WORKSPACE_POOL_VARIABLE, "Value": WORKSPACE_POOL} in worker["Environment"]
    assert _routes(both_synth, task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0])
    # one VPC for both worker tiers (one NAT bill)
    assert len(both_synth.resources("AWS::EC2::VPC")) == 2  # the workers' and the sandbox function's
    _, group = _one_of(both_synth, "AWS::AutoScaling::AutoScalingGroup")
    (service,) = both_synth.resources("AWS::ECS::Service").values()
    fargate_subnets = service["Properties"]["NetworkConfiguration"]["AwsvpcConfiguration"]["Subnets"]
    assert group["Properties"]["VPCZoneIdentifier"] == fargate_subnets


def _machine_sends_to(synth: Synthesized) -> set[str]:
    """The queue names the fan-out state machine's role may send to."""
    names = {lid: r["Properties"]["QueueName"] for lid, r in synth.resources("AWS::SQS::Queue").items()}
    (machine,) = synth.resources("AWS::StepFunctions::StateMachine").values()
    role_id = machine["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    return {
        names[r["Fn::GetAtt"][0]] for s in _statements_of_role(synth, role_id)
        if "sqs:SendMessage" in _as_list(s["Action"]) for r in _as_list(s["Resource"])
        if isinstance(r, dict) and r.get("Fn::GetAtt", [""])[0] in names
    }  # fmt: skip


@pytest.mark.parametrize("tier", TIERS)
def test_a_spawn_from_a_workspace_worker_sends_its_children_and_its_parents_wake_where_the_fanout_may_send(
    synth: Synthesized, tier: str
) -> None:
    """The tier's worker reads the workspace pool (its unit's environment), and its fan-out
    launcher (``StepFunctionsFanout``, with that worker's ``TaskQueues``) names its own pool's
    queue as the children's and the parent's. Were the machine's role not granted them, RunChild
    would fail AccessDenied (caught: the child is ``no_report`` and never runs) and WakeParent
    would fail the execution (the parent waits for ever). The launcher runs here as the worker
    runs it; only the two AWS clients are stand-ins, recording what it would send."""
    from types import SimpleNamespace

    from agentq.queueing.queues import TaskQueues
    from agentq.queueing.stepfunctions import StepFunctionsFanout
    from agentq.resources import ResourceNames

    cfg = _cfg(synth)
    started: list[dict[str, Any]] = []

    def start_execution(**kwargs: Any) -> dict[str, str]:
        started.append(json.loads(kwargs["input"]))
        return {"executionArn": "x"}

    sqs = SimpleNamespace(get_queue_url=lambda QueueName: {"QueueUrl": f"https://sqs.local/123456789012/{QueueName}"})
    sfn = SimpleNamespace(start_execution=start_execution)
    worker_env = unit.environment({})
    queues = TaskQueues(sqs, ResourceNames.for_prefix(cfg.prefix), pool=worker_env[POOL_VARIABLE],
                        workspace_pool=worker_env[WORKSPACE_POOL_VARIABLE])  # fmt: skip
    parent = SimpleNamespace(task_id="p" * 32, tenant="acme", submission=SimpleNamespace(priority=tier))
    StepFunctionsFanout(sfn, "arn:aws:states:eu-west-1:123456789012:stateMachine:f", queues).start(
        parent=parent,  # type: ignore[arg-type]
        spawn_id="s1",
        children=[("c" * 32, 600)],
        max_concurrency=1,
    )
    (execution,) = started
    allowed = _machine_sends_to(synth)
    for key in ("child_queue_url", "parent_queue_url"):
        queue = execution[key].rsplit("/", 1)[1]
        assert queue == f"{cfg.prefix}-{WORKSPACE_POOL}-{tier}", (key, queue)
        assert queue in allowed, f"{key} {queue}: the fan-out's role may send to {sorted(allowed)} only"


def test_the_tier_alarms_on_starved_workspace_queues_their_dlqs_and_a_worker_that_cannot_sandbox(
    synth: Synthesized,
) -> None:
    cfg = _cfg(synth)
    alarms = {a["Properties"]["AlarmName"]: a["Properties"] for a in synth.resources("AWS::CloudWatch::Alarm").values()
              if "AlarmName" in a["Properties"]}  # fmt: skip
    queues = _workspace_queue_ids(synth)
    for tier in TIERS:
        starved = alarms[f"{cfg.prefix}-workspace-{tier}-queue-starved"]
        assert starved["MetricName"] == "ApproximateNumberOfMessagesVisible" and starved["Statistic"] == "Minimum"
        assert starved["EvaluationPeriods"] == cfg.workspace.ec2.starved_minutes and starved["Period"] == 60
        assert starved["Dimensions"][0]["Value"]["Fn::GetAtt"][0] == queues[f"{cfg.prefix}-workspace-{tier}"]
        dlq = alarms[f"{cfg.prefix}-workspace-{tier}-dlq-not-empty"]
        assert dlq["Dimensions"][0]["Value"]["Fn::GetAtt"][0] == queues[f"{cfg.prefix}-workspace-{tier}-dlq"]
        assert starved["AlarmActions"] and dlq["AlarmActions"]
    sandbox = alarms[f"{cfg.prefix}-workspace-sandbox-unavailable"]
    (metric_filter,) = synth.resources("AWS::Logs::MetricFilter").values()
    assert metric_filter["Properties"]["FilterPattern"] == unit.SANDBOX_UNAVAILABLE
    transform = metric_filter["Properties"]["MetricTransformations"][0]
    assert (sandbox["MetricName"], sandbox["Namespace"]) == (transform["MetricName"], transform["MetricNamespace"])
    assert sandbox["Threshold"] == 1 and sandbox["AlarmActions"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"instance_type": "m7i.large"}, "workspace.ec2.instance_type"),  # x86 on an arm64 stack
        ({"min_instances": 3, "max_instances": 2}, "workspace.ec2.min_instances"),
        ({"instance_type": "m7g large"}, "instance_type"),
    ],
)
def test_an_inconsistent_tier_setting_fails_the_synth_naming_the_field(change: dict[str, Any], field: str) -> None:
    from pydantic import ValidationError

    from tests.test_cdk_stack import CDK_CONTEXT

    env = json.loads(json.dumps(ENVIRONMENTS["staging"]))
    env["workspace"] = {"tier": "ec2", "ec2": change}
    from infra.settings import resolve

    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        resolve({"staging": env}, CDK_CONTEXT.get("environment_defaults"), "staging")
