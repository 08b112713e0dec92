"""cdk.json's ``budget_defaults``: what a submission leaves out, and the running limits the functions
admit under (handed to them by ``infra/task_runners.defaults_env``; left out, the fair-by-default
numbers are derived in ``infra/settings.py``, ``EnvironmentSettings._fair_by_default``)."""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentq.resources import TIERS

MAX_TASK_SECONDS = 24 * 3600  # the longest a task may run (Constraints.timeout_seconds upper bound)


class BudgetDefaults(BaseModel):
    """Handed to the functions as AGENTQ_DEFAULT_* environment variables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(200_000, ge=1)
    max_steps: int = Field(50, ge=1)
    timeout_seconds: int = Field(3600, ge=1, le=MAX_TASK_SECONDS)
    tenant_hourly_tokens: int | None = Field(None, ge=1, description="per-tenant hourly cap when a tenant has none")
    tenant_hourly_usd: Decimal | None = Field(
        None, gt=0, decimal_places=6, description="per-tenant hourly money cap (dollars) when a tenant has none"
    )
    economy_tiers: str | None = Field(
        None,
        pattern=r"^(high|normal|low)(,(high|normal|low))*$",
        description="tiers whose Anthropic tasks use the Message Batches API (half price) unless they say otherwise",
    )
    tenant_max_running: int | None = Field(
        None, ge=1, description="the most running tasks (sub-agents included) per tenant when a tenant has no override"
    )
    fleet_capacity: int | None = Field(
        None,
        ge=1,
        description="the most running tasks of all tenants together (the executors' reserved concurrency plus what "
        "the workers run): a saturated fleet is shared by the tenants' weights (AGENTQ_FLEET_CAPACITY)",
    )
    tier_capacity: dict[str, int] | None = Field(
        None,
        description="what each tier's runners run at once (AGENTQ_TIER_CAPACITY): a tenant's running tasks of a tier "
        "never exceed fair_limit of it (storage/tier_slots.py); left out, executor.tier_max_concurrency when the "
        "workers are off (the tier's event source is all that runs its tasks); {}: no tier slot",
    )

    @model_validator(mode="after")
    def _tiers(self) -> BudgetDefaults:
        given = self.tier_capacity or {}
        if not set(given) <= set(TIERS) or any(n < 1 for n in given.values()):
            raise ValueError(f"budget_defaults.tier_capacity names tiers of {', '.join(TIERS)}, each at least 1")
        return self
