"""Per-task credentials for workspace objects (``agentq.storage.workspace_access``): the EC2 tier's
least privilege, a task's workspace prefix only.

- The session policy, over every task id and tenant shape the API accepts: read and write under the
  task's own workspace prefix, read only under the owners its starting content is looked up in,
  nothing else; by IAM's own wildcard matching, no other task's key matches it. A name carrying an
  IAM wildcard or a policy variable is refused, never put in a policy. uuid ids at the deepest
  spawn fit STS's size limit; a longer chain widens the reads only, never the writes.
- On a moto server with IAM enforcement on (``INITIAL_NO_AUTH_ACTION_COUNT``, set through
  ``/moto-api/reset-auth`` after the setup): an identity denied every workspace object, as the
  tier's instance role is, cannot read or write one itself, but a worker process holding it runs a
  task with a workspace to the end, its files stored, through the role it assumes per task; the
  credentials are cached per task (one AssumeRole for many objects) and renewed before expiry.

moto 5.2.6 evaluates only an assumed role's own policies and ignores the session policy
(``moto/iam/access_control.py``: ``AssumedRoleAccessKey.collect_policies``), so that task A's
session cannot read task B's prefix is proven here by the policy's content under IAM's matching
rules, not by moto refusing the read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq.control.submit import submit
from agentq.core.models import TaskStatus, ToolsStep
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_queues, build_registry, build_store, session
from agentq.storage.workspace_access import (
    MAX_POLICY_CHARS,
    ROLE_VARIABLE,
    ScopedWorkspaceObjects,
    policy_text,
    session_name,
    session_policy,
)
from agentq.storage.workspaces import blob_key, upload_prefix, workspace_prefix
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

from tests.conftest import child_env
from tests.helpers import agentq_process, call, scripted, wait_for

BUCKET = "agentq-prod-payloads-123456789012-eu-west-1"
TASK_IDS = st.from_regex(r"\A[A-Za-z0-9_-]{1,128}\Z")  # api.models TASK_ID_PATTERN (uuid hex when generated)
TENANTS = st.from_regex(r"\A[A-Za-z0-9._-]{1,64}\Z")  # storage.api_keys.TENANT_PATTERN
OWNERS = st.one_of(TASK_IDS.map(lambda t: f"task:{t}"), TENANTS.map(lambda t: f"upload:{t}"))


def _iam_match(pattern: str, value: str) -> bool:
    """IAM's ARN matching: ``*`` any run of characters (slashes too), ``?`` one, the rest literal."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.DOTALL) is not None


def _allows(policy: dict[str, Any], action: str, key: str) -> bool:
    arn = f"arn:aws:s3:::{BUCKET}/{key}"
    for s in policy["Statement"]:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
        if s["Effect"] == "Allow" and action in actions and any(_iam_match(r, arn) for r in resources):
            return True
    return False


def _prefix_of(owner: str) -> str:
    kind, _, name = owner.partition(":")
    return workspace_prefix(name) if kind == "task" else upload_prefix(name)


@settings(max_examples=300, deadline=None)
@given(task=TASK_IDS, lookup=st.lists(OWNERS, max_size=3), other=TASK_IDS, tenant=TENANTS)
def test_a_tasks_session_policy_names_its_own_workspace_read_write_and_its_lookups_read_only(
    task: str, lookup: list[str], other: str, tenant: str
) -> None:
    policy = session_policy(BUCKET, task, lookup)
    own = f"arn:aws:s3:::{BUCKET}/tasks/{task}/workspace/*"
    expected: list[dict[str, Any]] = [
        {"Sid": "OwnWorkspace", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"], "Resource": own}
    ]
    reads = sorted({f"arn:aws:s3:::{BUCKET}/{_prefix_of(o)}*" for o in lookup} - {own})
    if reads:
        expected.append({"Sid": "StartingContent", "Effect": "Allow", "Action": "s3:GetObject", "Resource": reads})
    assert policy == {"Version": "2012-10-17", "Statement": expected}
    key = blob_key(task, "ab" * 32)
    assert _allows(policy, "s3:GetObject", key) and _allows(policy, "s3:PutObject", key)
    for action in ("s3:ListBucket", "s3:DeleteObject", "s3:GetObjectVersion", "s3:PutObjectAcl"):
        assert not _allows(policy, action, key), action
    # another task's workspace and payloads, a tenant's uploads, step payloads: read only when
    # looked up, written never (but the task's own)
    for key, readable, writable in [
        (blob_key(other, "cd" * 32), f"task:{other}" in lookup or other == task, other == task),
        (f"{upload_prefix(tenant)}blobs/{'ef' * 32}", f"upload:{tenant}" in lookup, False),
        (f"tasks/{task}/steps/000001-e1.json", False, False),
        (f"tasks/{other}/steps/000001-e1.json", False, False),
    ]:
        assert _allows(policy, "s3:GetObject", key) == readable, key
        assert _allows(policy, "s3:PutObject", key) == writable, key


@pytest.mark.parametrize(
    ("task", "lookup"),
    [("a*", []), ("?", []), ("${aws:username}", []), ("a/b", []), ("", []), ("t", ["task:*"]), ("t", ["upload:a?"]),
     ("t", ["upload:${aws:PrincipalTag/x}"]), ("t", ["task:x/../y"]), ("t", ["bucket:x"])],
)  # fmt: skip
def test_a_name_that_would_widen_its_own_grant_is_refused_not_put_in_a_policy(task: str, lookup: list[str]) -> None:
    with pytest.raises(ValueError):
        session_policy(BUCKET, task, lookup)


def test_uuid_task_ids_at_the_deepest_spawn_fit_the_session_policy_limit() -> None:
    ids = [hashlib.sha256(str(i).encode()).hexdigest()[:32] for i in range(12)]
    lookup = [f"task:{t}" for t in ids[1:11]] + ["upload:" + "t" * 64]  # max_depth 10 ancestors, an upload
    policy = session_policy("b" * 63, ids[0], lookup)
    assert len(policy_text(policy)) <= MAX_POLICY_CHARS
    assert len(policy["Statement"][1]["Resource"]) == 11


def test_a_chain_too_long_for_the_limit_widens_the_reads_only_never_the_writes() -> None:
    lookup = [f"task:{str(i) * 128}" for i in range(10)]
    policy = session_policy(BUCKET, "t" * 128, lookup)
    assert len(policy_text(policy)) <= MAX_POLICY_CHARS
    own, reads = policy["Statement"]
    assert own["Resource"] == f"arn:aws:s3:::{BUCKET}/tasks/{'t' * 128}/workspace/*"
    assert (reads["Action"], reads["Resource"]) == ("s3:GetObject", f"arn:aws:s3:::{BUCKET}/tasks/*/workspace/*")


@given(task=TASK_IDS)
def test_a_role_session_name_is_one_sts_accepts_for_every_task_id(task: str) -> None:
    assert re.fullmatch(r"[\w+=,.@-]{2,64}", session_name(task))


# ------------------------------------------------------------------ on moto with IAM enforced


def _reset_auth(server: MotoServer, count: str) -> None:
    request = urllib.request.Request(
        f"{server.endpoint_url}/moto-api/reset-auth",
        data=count.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},
    )  # not a form: moto reads the raw body
    urllib.request.urlopen(request, timeout=10).read()


def _keys(iam: Any, user: str, policy: dict[str, Any]) -> dict[str, str]:
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


def _boto(settings_: Settings, keys: dict[str, str]) -> boto3.session.Session:
    return boto3.session.Session(
        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"], aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        region_name=settings_.region,
    )  # fmt: skip


@pytest.fixture(scope="module")
def enforcing() -> Iterator[tuple[Settings, dict[str, str], dict[str, str], str]]:
    """A moto server of its own with a deployment, an admin, an "instance" identity denied every
    workspace object (as the tier's instance role is), the workspace objects role it may assume,
    then IAM enforcement on."""
    for key, value in LOCAL_CREDENTIALS.items():  # the setup's, before enforcement (as conftest's moto_server)
        os.environ.setdefault(key, value)
    with MotoServer() as server:
        s = Settings.for_prefix("wsiam", server.endpoint_url, tool_modules=("tests.effect_tools",))
        provision(session(s), s.names, endpoint_url=s.endpoint_url, queues=QueueSettings())
        iam = boto3.client("iam", endpoint_url=server.endpoint_url, region_name=s.region,
                           aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
        workspace = f"arn:aws:s3:::{s.bucket}/tasks/*/workspace/*"
        admin = _keys(iam, "admin", {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "*", "Resource": "*"}]})  # fmt: skip
        instance = _keys(iam, "instance", {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "*", "Resource": "*"},
            {"Effect": "Deny", "Action": ["s3:GetObject", "s3:PutObject"], "Resource": workspace}]})  # fmt: skip
        account = _boto(s, admin).client("sts", endpoint_url=server.endpoint_url).get_caller_identity()["Account"]
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                 "Principal": {"AWS": f"arn:aws:iam::{account}:user/instance"}}]}  # fmt: skip
        role = iam.create_role(RoleName="workspace-objects", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
        iam.put_role_policy(RoleName="workspace-objects", PolicyName="p", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"], "Resource": workspace}]}))  # fmt: skip
        _reset_auth(server, "0")  # every request from here on is authenticated and authorised
        try:
            yield s, admin, instance, role
        finally:
            _reset_auth(server, "inf")


def test_the_instance_identity_itself_reaches_no_workspace_object_but_its_per_task_credentials_do(
    enforcing: tuple[Settings, dict[str, str], dict[str, str], str],
) -> None:
    s, _admin, instance, role = enforcing
    plain = build_store(s, sess=_boto(s, instance))
    with pytest.raises(Exception, match="AccessDenied"):
        plain.workspaces.put_blob("task-a", "ab" * 32, b"x")
    scoped = build_store(s.__class__(**{**s.__dict__, "workspace_role_arn": role}), sess=_boto(s, instance))
    objects = scoped.workspaces
    assert isinstance(objects, ScopedWorkspaceObjects)
    for i in range(20):
        objects.put_blob("task-a", hashlib.sha256(str(i).encode()).hexdigest(), str(i).encode())
    assert objects.get_blob("task-a", hashlib.sha256(b"7").hexdigest()) == b"7"
    with pytest.raises(LookupError):  # missing: falls through as on a 404
        objects.get_blob("task-a", "00" * 32)
    assert objects.assumed == 1  # one AssumeRole for the task's many objects
    objects.put_blob("task-b", "cd" * 32, b"y")
    assert objects.assumed == 2  # each task its own session
    with pytest.raises(Exception, match="AccessDenied"):
        plain.workspaces.get_blob("task-a", hashlib.sha256(b"7").hexdigest())


def test_cached_credentials_are_renewed_before_they_expire(
    enforcing: tuple[Settings, dict[str, str], dict[str, str], str],
) -> None:
    s, _admin, instance, role = enforcing
    now = [0.0]
    store = build_store(s.__class__(**{**s.__dict__, "workspace_role_arn": role}), sess=_boto(s, instance))
    objects = store.workspaces
    assert isinstance(objects, ScopedWorkspaceObjects)
    objects._clock = lambda: now[0]  # the credentials' Expiration is real time: move this clock to it
    objects.put_blob("task-c", "ab" * 32, b"x")
    ((_, expires, _),) = objects._cached.values()
    now[0] = expires - 301  # still more than REFRESH_SECONDS left: reused
    objects.put_blob("task-c", "cd" * 32, b"y")
    assert objects.assumed == 1
    now[0] = expires - 299  # within REFRESH_SECONDS of expiry: renewed before a call can start on them
    objects.put_blob("task-c", "ef" * 32, b"z")
    assert objects.assumed == 2


@pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
def test_a_worker_denied_workspace_objects_runs_a_workspace_task_through_its_per_task_credentials(
    enforcing: tuple[Settings, dict[str, str], dict[str, str], str],
) -> None:
    s, admin, instance, role = enforcing
    admin_session = _boto(s, admin)
    store, queues = build_store(s, sess=admin_session), build_queues(s, sess=admin_session)
    content = "written through a task's own credentials\n"
    sub = scripted([{"text": "w", "tool_calls": [call("write_file", path="notes.md", content=content)]},
                    {"text": "done"}], tools=["write_file"])  # fmt: skip
    task = submit(store, build_registry(s), sub, tenant="t", queues=queues)
    env = {k: v for k, v in child_env(s, **{ROLE_VARIABLE: role}).items() if k != "AWS_SESSION_TOKEN"}
    env.update(instance)
    assert env["AWS_ACCESS_KEY_ID"] != LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"]
    worker = agentq_process(["worker", "--concurrency", "2", "--lease", "5", "--heartbeat", "1"], env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        final = wait_for(lambda: (t := store.tasks.get(task.task_id)).status.terminal and t, 60, "the task ends")
    finally:
        worker.terminate()
        out, _ = worker.communicate(timeout=30)
    assert final.status is TaskStatus.SUCCEEDED, (final.error, out[-3000:])
    (tools,) = [st_.body for st_ in store.steps.load(task.task_id) if isinstance(st_.body, ToolsStep)]
    assert tools.workspace is not None
    digest = hashlib.sha256(content.encode()).hexdigest()
    assert store.workspaces.get_blob(task.task_id, digest) == content.encode()  # stored, read back as admin
