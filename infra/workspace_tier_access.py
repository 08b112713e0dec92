"""The EC2 workspace tier's least privilege and its scale-in (``infra/workspace_tier.py`` builds
the rest): the role a worker assumes per task to reach that task's workspace objects, and the
termination lifecycle hook an instance's worker drains under. docs/SANDBOX.md "Where it runs in
AWS" says why; tests/test_cdk_workspace_tier.py pins both.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_iam as iam
from constructs import Construct

from agentq.storage.workspace_access import DURATION_SECONDS
from infra import workspace_unit as unit
from infra.data import Data
from infra.settings import EnvironmentSettings

WORKSPACE_OBJECTS = "tasks/*/workspace/*"  # storage.workspaces: every task's, and the tenants' uploads


def workspace_objects_role(scope: Construct, role: iam.Role, data: Data) -> iam.Role:
    """Least privilege for workspace content: the instance role is denied every task's workspace
    objects; it assumes this role per task, with a session policy naming only that task's prefix
    (and, read only, where its starting content is), and the session gets the intersection. This
    role's own policy is the most any session may hold: Get/Put of workspace objects, no list, no
    delete (retention purges them with the task, from the sweeper)."""
    workspace_objects = data.payloads.arn_for_objects(WORKSPACE_OBJECTS)
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="NoWorkspaceObjects", effect=iam.Effect.DENY, actions=["s3:GetObject", "s3:PutObject"],
            resources=[workspace_objects],
        )
    )  # fmt: skip
    objects_role = iam.Role(
        scope,
        "WorkspaceObjectsRole",
        assumed_by=iam.ArnPrincipal(role.role_arn),
        max_session_duration=cdk.Duration.seconds(DURATION_SECONDS),
        description="agentq workspace tier: one task's workspace objects, assumed per task with a session policy",
    )
    objects_role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="TaskWorkspaces", actions=["s3:GetObject", "s3:PutObject"], resources=[workspace_objects]
        )
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="AssumeWorkspaceObjectsRole", actions=["sts:AssumeRole"], resources=[objects_role.role_arn]
        )
    )
    return objects_role


def drain_on_termination(group: autoscaling.AutoScalingGroup, role: iam.Role, cfg: EnvironmentSettings) -> None:
    """A termination lifecycle hook: an instance the group scales in waits in
    ``Terminating:Wait`` while its worker drains (``agentq.scale_in``), up to ``DRAIN_SECONDS``,
    then terminates whatever the worker said (``CONTINUE``: a worker that never answers, dead or
    stuck, holds nothing another cannot take over once its lease lapses). The worker may complete
    the action of its own group only."""
    group.add_lifecycle_hook(
        "DrainOnTermination",
        lifecycle_hook_name=unit.lifecycle_hook_name(cfg.prefix),
        lifecycle_transition=autoscaling.LifecycleTransition.INSTANCE_TERMINATING,
        heartbeat_timeout=cdk.Duration.seconds(unit.DRAIN_SECONDS),
        default_result=autoscaling.DefaultResult.CONTINUE,
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="CompleteOwnLifecycleAction",
            actions=["autoscaling:CompleteLifecycleAction"],
            resources=[cdk.Stack.of(group).format_arn(
                service="autoscaling", resource="autoScalingGroup",
                resource_name=f"*:autoScalingGroupName/{unit.group_name(cfg.prefix)}",
                arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
            )],
        )
    )  # fmt: skip
