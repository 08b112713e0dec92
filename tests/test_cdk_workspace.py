"""Where a task's workspace runs in the deployed stack, and what it may touch (issue 42, item 5),
pinned on the synthesized templates of every environment (and of dev with the Fargate worker).

- The executor and the worker keep a run's workspace in their own ``/tmp``
  (``AGENTQ_WORKSPACE_ROOT``), under the environment's limits (``workspace`` in cdk.json, as
  ``AGENTQ_WORKSPACE_MAX_BYTES``/``_FILES``, which the API also gets to refuse a submission that
  asks for more).
- Workspace content (``tasks/<id>/workspace/...``) is reached by the task runners (read, write),
  the API (a task's files, a fork's copies) and the reaper (deletion) only, every grant of them
  under the bucket's ``tasks/`` prefix, never the whole bucket nor another; the event streams,
  which read other payloads under that prefix, are denied it.
- The sandbox function, where ``python_exec`` runs in AWS, gets no table, bucket or queue.
"""

from __future__ import annotations

import json
import os
from typing import Any

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from agentq.control.defaults import Defaults
from agentq.core.engine._workspace import ROOT_VARIABLE
from agentq.core.workspace import WorkspaceQuota
from agentq.resources import PAYLOAD_PREFIX
from infra.synth import Synthesized
from infra.task_runners import WORKSPACE_ROOT, WORKSPACE_ROOT_VARIABLE

from tests.test_cdk_stack import _actions, _as_list, _function, _statements_of_role, settings_of
from tests.test_cdk_stack import synth as synth  # the fixtures: one synth a run, whichever module asks
from tests.test_cdk_stack import synth_root as synth_root
from tests.test_cdk_stack import worker_synth as worker_synth

OBJECT_ACTIONS = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}
LIMITS = ("AGENTQ_WORKSPACE_MAX_BYTES", "AGENTQ_WORKSPACE_MAX_FILES")


def _env(synth: Synthesized, name: str) -> dict[str, str]:
    _, fn = _function(synth, name)
    return dict(fn["Properties"]["Environment"]["Variables"])


def _quota(env: dict[str, str]) -> WorkspaceQuota:
    return Defaults.from_env(env).workspace_quota()


def test_the_task_runners_keep_workspaces_in_their_tmp_under_the_environments_limits(synth: Synthesized) -> None:
    cfg = settings_of(synth.env_name)
    wanted = WorkspaceQuota(max_bytes=cfg.workspace.max_bytes, max_files=cfg.workspace.max_files)
    assert WORKSPACE_ROOT_VARIABLE == ROOT_VARIABLE and WORKSPACE_ROOT.startswith("/tmp/")
    executor = _env(synth, "executor")
    assert executor[ROOT_VARIABLE] == WORKSPACE_ROOT
    assert _quota(executor) == wanted
    api = _env(synth, "api")  # refuses a submission that asks for more
    assert _quota(api) == wanted and ROOT_VARIABLE not in api
    sandbox = _env(synth, "sandbox")
    assert not any(k in sandbox for k in (ROOT_VARIABLE, *LIMITS, "AGENTQ_TABLE", "AGENTQ_BUCKET"))


def test_the_environments_differ_only_where_cdk_json_says_and_default_to_the_local_stacks() -> None:
    defaults = settings_of("staging").workspace
    assert (defaults.max_bytes, defaults.max_files) == (WorkspaceQuota().max_bytes, WorkspaceQuota().max_files)
    dev = settings_of("dev").workspace
    assert dev.max_bytes < defaults.max_bytes and dev.max_files < defaults.max_files


def test_the_fargate_worker_keeps_workspaces_on_its_tmp_volume_under_the_limits(worker_synth: Synthesized) -> None:
    cfg = settings_of("dev")
    (task,) = worker_synth.resources("AWS::ECS::TaskDefinition").values()
    (worker,) = [c for c in task["Properties"]["ContainerDefinitions"] if c.get("Command", [""])[0] == "agentq"]
    env = {e["Name"]: e["Value"] for e in worker["Environment"]}
    assert env[ROOT_VARIABLE] == WORKSPACE_ROOT
    assert _quota(env) == WorkspaceQuota(max_bytes=cfg.workspace.max_bytes, max_files=cfg.workspace.max_files)
    mounts = {m["ContainerPath"] for m in worker.get("MountPoints", [])}
    assert "/tmp" in mounts and worker["ReadonlyRootFilesystem"] is True  # /tmp the one writable place


def _role_ids(synth: Synthesized) -> dict[str, str]:
    """Role logical id -> what it belongs to (a function's name, or the role's own id). A role two
    functions share is named by the API when it is one of them: the A2A streaming function runs
    with the API's own role (infra/a2a.py)."""
    named: dict[str, list[str]] = {}
    for fn in synth.resources("AWS::Lambda::Function").values():
        props = fn["Properties"]
        if isinstance(props.get("FunctionName"), str) and "Fn::GetAtt" in props.get("Role", {}):
            named.setdefault(props["Role"]["Fn::GetAtt"][0], []).append(props["FunctionName"].rsplit("-", 1)[-1])
    owners = {rid: "api" if "api" in names else sorted(names)[0] for rid, names in named.items()}
    return {rid: owners.get(rid, rid) for rid in synth.resources("AWS::IAM::Role")}


def _object_grants(synth: Synthesized) -> dict[str, tuple[list[str], list[str]]]:
    """Per role: the resources its Allow statements grant an object action on, and those a Deny covers."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for rid, owner in _role_ids(synth).items():
        allowed: list[str] = []
        denied: list[str] = []
        for statement in _statements_of_role(synth, rid):
            if (
                statement.get("Sid") == "WorkerArtifacts"
            ):  # the EC2 tier's code, by exact asset key (test_cdk_workspace_tier)
                continue
            if set(_as_list(statement["Action"])) & OBJECT_ACTIONS:
                target = denied if statement.get("Effect") == "Deny" else allowed
                target += [json.dumps(r, sort_keys=True) for r in _as_list(statement["Resource"])]
        if allowed or denied:
            out[owner] = (allowed, denied)
    return out


def _reaching_workspace_content(synth: Synthesized) -> set[str]:
    """The roles an Allow lets read, write or delete workspace content (not also denied it),
    after checking that every object grant of every role is under the payload bucket's
    ``tasks/`` prefix: not the whole bucket, not another bucket."""
    (bucket,) = [
        lid for lid, b in synth.resources("AWS::S3::Bucket").items()
        if b["Properties"].get("LoggingConfiguration", {}).get("LogFilePrefix") == "payloads/"
    ]  # fmt: skip
    reaching = set()
    for owner, (allowed, denied) in _object_grants(synth).items():
        for resource in allowed:
            assert bucket in resource and f'"/{PAYLOAD_PREFIX}*' in resource, (owner, resource)
        if allowed and not any(f"/{PAYLOAD_PREFIX}*/workspace/*" in r for r in denied):
            reaching.add(owner)
    return reaching


def test_workspace_content_is_reached_by_the_runners_the_api_and_the_reaper_only_under_the_task_prefix(
    synth: Synthesized,
) -> None:
    reaching = _reaching_workspace_content(synth)
    others = reaching - {"executor", "api", "reaper"}
    assert {"executor", "api", "reaper"} <= reaching
    if settings_of(synth.env_name).workspace.tier == "ec2":
        # and the EC2 tier's instances, a task runner too: not with their own role, which is
        # denied it, but through the role they assume per task (test_cdk_workspace_tier.py)
        (role,) = others
        roles = synth.resources("AWS::IAM::Role")
        (trusted,) = [
            p["AWS"]["Fn::GetAtt"][0] for s in roles[role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
            for p in [s["Principal"]]
        ]  # fmt: skip
        assert "ec2.amazonaws.com" in json.dumps(roles[trusted]["Properties"]["AssumeRolePolicyDocument"])
        assert trusted not in reaching
    else:
        assert not others
    assert "events" in _object_grants(synth)  # it reads other payloads, and is denied these


def test_with_the_fargate_worker_its_task_role_is_the_one_more_that_reaches_workspace_content(
    worker_synth: Synthesized,
) -> None:
    reaching = _reaching_workspace_content(worker_synth)
    others = reaching - {"executor", "api", "reaper"}
    assert {"executor", "api", "reaper"} <= reaching and len(others) == 1
    (role,) = others
    assume = json.dumps(worker_synth.resources("AWS::IAM::Role")[role]["Properties"]["AssumeRolePolicyDocument"])
    assert "ecs-tasks.amazonaws.com" in assume


def test_the_sandbox_function_reaches_no_table_bucket_queue_or_machine(synth: Synthesized) -> None:
    _, sandbox = _function(synth, "sandbox")
    actions = _actions(_statements_of_role(synth, sandbox["Properties"]["Role"]["Fn::GetAtt"][0]))
    assert not {a for a in actions if a.split(":")[0] in {"dynamodb", "s3", "sqs", "states", "lambda", "events"}}


def _workspace_denied(statements: list[dict[str, Any]]) -> bool:
    return any(s.get("Effect") == "Deny" and "workspace" in json.dumps(s["Resource"]) for s in statements)


def test_the_event_streams_are_denied_workspace_content(synth: Synthesized) -> None:
    _, events = _function(synth, "events")
    statements = _statements_of_role(synth, events["Properties"]["Role"]["Fn::GetAtt"][0])
    assert _workspace_denied(statements)
    deny = next(s for s in statements if s.get("Effect") == "Deny")
    assert deny["Sid"] == "NoWorkspaceContent" and _as_list(deny["Action"]) == ["s3:GetObject"]
    assert json.dumps(deny["Resource"]).endswith(f'/{PAYLOAD_PREFIX}*/workspace/*"]]}}')
