"""cdk.json's ``workspace``: a task workspace's limits and where tasks with a workspace run in
AWS (the EC2 tier, infra/workspace_tier.py); and the backlog steps a tier scales out by."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentq.core.workspace import WorkspaceQuota


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScalingStep(_Strict):
    backlog: int = Field(ge=1, description="messages waiting or in flight across the tiers")
    change: int = Field(ge=1, description="tasks to add at this backlog")


class WorkspaceEc2Settings(_Strict):
    """The EC2 workspace tier (infra/workspace_tier.py): an Auto Scaling group of Amazon Linux 2023
    instances, each running ``agentq worker`` on the workspace pool's queues with bubblewrap."""

    instance_type: str = Field(
        "m7g.large", pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$", description="Graviton (…g.) for arm64, else x86_64"
    )
    min_instances: int = Field(0, ge=0, le=100, description="0: the first workspace task waits for a boot")
    max_instances: int = Field(2, ge=1, le=100)
    concurrency: int = Field(16, ge=1, le=1024, description="tasks one instance runs at once")
    root_volume_gb: int = Field(100, ge=20, le=16384, description="gp3, encrypted: the OS, the code, the workspaces")
    scale_out: list[ScalingStep] = Field(
        default_factory=lambda: [ScalingStep(backlog=1, change=1), ScalingStep(backlog=64, change=2)]
    )
    starved_minutes: int = Field(
        15, ge=1, le=1440, description="alarm when a workspace queue has had a message waiting for this long"
    )

    @model_validator(mode="after")
    def _consistent(self) -> WorkspaceEc2Settings:
        if self.min_instances > self.max_instances:
            raise ValueError("workspace.ec2.min_instances must not exceed workspace.ec2.max_instances")
        backlogs = [s.backlog for s in self.scale_out]
        if not backlogs or backlogs != sorted(set(backlogs)):
            raise ValueError("workspace.ec2.scale_out backlogs must be distinct and ascending")
        return self


class WorkspaceSettings(_Strict):
    """A task workspace's limits (``core.workspace.WorkspaceQuota``), handed to the API and the
    task runners as AGENTQ_WORKSPACE_MAX_BYTES / AGENTQ_WORKSPACE_MAX_FILES: every task's bound,
    and the most a submission may ask for (it may ask for less). ``tier``: where tasks with a
    workspace run in AWS: ``none`` (the Lambda executor or the Fargate worker, where the
    workspace tools fail closed: no user namespaces) or ``ec2`` (their own queues and the EC2
    tier, docs/SANDBOX.md)."""

    max_bytes: int = Field(WorkspaceQuota().max_bytes, ge=1, le=1 << 40, description="bytes of a task's files")
    max_files: int = Field(
        WorkspaceQuota().max_files, ge=1, le=10_000_000, description="a task's entries: files, directories, links"
    )
    tier: Literal["none", "ec2"] = "none"
    ec2: WorkspaceEc2Settings = Field(default_factory=WorkspaceEc2Settings)
