"""The engine's settings (``runtime.build_engine`` reads them from the environment)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentq.core.providers.base import DEFAULT_MAX_CALL_SECONDS
from agentq.core.tenancy import TenantLimits
from agentq.core.workspace import WorkspaceQuota


@dataclass(frozen=True)
class EngineConfig:
    lease_seconds: float = 30.0
    heartbeat_seconds: float | None = None  # default: a third of the lease
    slice_margin_seconds: float = 30.0  # stop this long before the caller's deadline
    default_tenant_limits: TenantLimits | None = None  # for tenants without limits of their own
    # The longest a provider call (its retries included) can take to complete. A hold stays
    # counted that long after its call could have started, even if its worker lost the lease.
    max_call_seconds: float = DEFAULT_MAX_CALL_SECONDS
    # How often a task whose budget is reached only by calls of unknown outcome looks again
    # (``_holds.UnknownUsage``): their workers may yet report them, or a person raise the cap.
    unknown_recheck_seconds: float = 60.0
    # Where this worker keeps the workspaces of the tasks it runs (core.engine._workspace):
    # None: AGENTQ_WORKSPACE_ROOT, else <tmp>/agentq-workspaces. The per-task totals.
    workspace_root: str | None = None
    workspace_quota: WorkspaceQuota = field(default_factory=WorkspaceQuota)
    # How long a worker process reuses a tenant's policy documents before reading them again
    # (core.engine._policy): a new version is enforced within this long; one Query per tenant each.
    policy_cache_seconds: float = 5.0

    @property
    def heartbeat_interval(self) -> float:
        return self.heartbeat_seconds or self.lease_seconds / 3
