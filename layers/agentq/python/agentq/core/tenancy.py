"""Per-tenant limits: the hourly token and money caps a tenant's tasks share, what one call
holds on them, and the error that says one was reached (``storage.tenant_windows`` keeps the
windows themselves)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from pydantic import BaseModel, Field, model_validator

from agentq.core.errors import AgentqError


class TenantLimits(BaseModel):
    hourly_tokens: int | None = Field(default=None, ge=1)
    hourly_usd: Decimal | None = Field(default=None, gt=0, decimal_places=6, description="dollars an hour, priced")
    soft_ratio: float = Field(default=0.8, gt=0, le=1)

    @model_validator(mode="after")
    def _a_cap(self) -> TenantLimits:
        if self.hourly_tokens is None and self.hourly_usd is None:
            raise ValueError("hourly_tokens or hourly_usd: a tenant's limits need at least one cap")
        return self


@dataclass(frozen=True)
class WindowHold:
    """What one call holds on its tenant's hourly window (``hour``: the hour it was taken in,
    which its settlement adjusts however late it comes), in tokens and millionths of a dollar."""

    tenant: str
    hour: str
    amount: int
    micros: int = 0


class TenantCapReached(AgentqError):
    code = "tenant_hourly_cap"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after
