"""Per-tenant limits: the hourly token cap a tenant's tasks share, and the error that says it
was reached (``storage.tenant_windows`` keeps the windows themselves)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from agentq.core.errors import AgentqError


class TenantLimits(BaseModel):
    hourly_tokens: int = Field(ge=1)
    soft_ratio: float = Field(default=0.8, gt=0, le=1)


class TenantCapReached(AgentqError):
    code = "tenant_hourly_cap"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after
