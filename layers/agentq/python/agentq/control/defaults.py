"""A deployment's defaults for what a caller leaves out: budget constraints, the tenant
hourly cap, the tenant running limit, the fleet's capacity, and a task workspace's limits
(which are also the most a task may ask for: ``workspace`` in cdk.json).

The core's ``Constraints`` defaults suit a laptop; a platform team sets its own per
environment (``budget_defaults`` in cdk.json), which reach the functions as ``AGENTQ_DEFAULT_*``
variables. Only fields the caller did not send are filled: an explicit value always wins,
so the same request means the same thing in every environment except where it is silent.
A bad variable fails at cold start naming the variable, never on a request.

``tier_capacity`` (``AGENTQ_TIER_CAPACITY``) is the one value given as a capacity rather than a
limit: each tier's running limit per tenant is always ``fair_limit`` of it (``tier_limits``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from agentq.core.errors import AgentqError, ValidationError
from agentq.core.models import MAX_TIMEOUT_SECONDS, Constraints, TaskSubmission
from agentq.core.tenancy import TenantLimits
from agentq.core.workspace import WorkspaceQuota

if TYPE_CHECKING:
    from agentq.storage.container import Storage
    from agentq.storage.running_slots import RunningSlots

# field -> environment variable
ENVIRONMENT = {
    "max_tokens": "AGENTQ_DEFAULT_MAX_TOKENS",
    "max_steps": "AGENTQ_DEFAULT_MAX_STEPS",
    "timeout_seconds": "AGENTQ_DEFAULT_TIMEOUT_SECONDS",
    "tenant_hourly_tokens": "AGENTQ_DEFAULT_TENANT_HOURLY_TOKENS",
    "tenant_hourly_usd": "AGENTQ_DEFAULT_TENANT_HOURLY_USD",
    "tenant_max_running": "AGENTQ_DEFAULT_TENANT_MAX_RUNNING",
    "fleet_capacity": "AGENTQ_FLEET_CAPACITY",
    "tier_capacity": "AGENTQ_TIER_CAPACITY",
    "economy_tiers": "AGENTQ_ECONOMY_TIERS",
    "workspace_max_bytes": "AGENTQ_WORKSPACE_MAX_BYTES",
    "workspace_max_files": "AGENTQ_WORKSPACE_MAX_FILES",
}
CONSTRAINT_FIELDS = ("max_tokens", "max_steps", "timeout_seconds")


# The part of a fleet no one tenant may take by default (``fair_limit``): 5 %, at least one slot.
FLEET_RESERVE_PERCENT = 5


def fleet_reserve(capacity: int) -> int:
    """The fleet slots kept free of any one tenant's burst under a fleet of ``capacity``: 5 %
    of it rounded up, at least one (none under a capacity of 1, where a tenant needs the one)."""
    return min(capacity - 1, max(1, -(-capacity * FLEET_RESERVE_PERCENT // 100)))


def fair_limit(capacity: int) -> int:
    """A tenant's default running limit under a fleet of ``capacity``: the capacity less its
    reserve (``fleet_reserve``). Fair by default: however large one tenant's burst, the reserve
    stays free of it, so a quiet tenant's first task is admitted and claimed at once instead of
    waiting for one of the burst's tasks to end (its turns may take minutes). The reserve is
    not idle capacity kept from everyone: the fleet's weights share it among the tenants that
    run (a second tenant takes it, and with two or more backlogged the whole fleet runs); only
    a lone tenant leaves it free. Without preemption no rule can give a lone tenant the whole
    fleet and a newcomer a slot at once; this one costs the lone tenant ``fleet_reserve`` slots.
    Set by the deployments' configuration (``infra/settings.py``'s derived budget defaults,
    ``agentq dev``'s ``agentq_dev.stack.dev_defaults``), never by ``Defaults`` itself: a
    ``Defaults`` says what its variables say."""
    return max(1, capacity - fleet_reserve(capacity))


class ConfigurationError(AgentqError):
    """The deployment's configuration is unusable; ``field`` names the variable."""

    code = "configuration_error"


class Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int | None = Field(None, ge=1, le=1_000_000_000)
    max_steps: int | None = Field(None, ge=1, le=10_000)
    timeout_seconds: int | None = Field(None, ge=1, le=MAX_TIMEOUT_SECONDS)
    tenant_hourly_tokens: int | None = Field(None, ge=1, description="cap for tenants with no limits of their own")
    economy_tiers: str | None = Field(
        None,
        pattern=r"^(high|normal|low)(,(high|normal|low))*$",
        description="tiers (comma-separated) whose Anthropic tasks run in economy mode unless they say otherwise",
    )
    tenant_hourly_usd: Decimal | None = Field(
        None, gt=0, decimal_places=6, description="money cap (dollars an hour) for tenants with no limits of their own"
    )
    tenant_max_running: int | None = Field(
        None, ge=1, description="the most running tasks (sub-agents included) of a tenant with no override of its own"
    )
    fleet_capacity: int | None = Field(
        None,
        ge=1,
        description="the most running tasks of all tenants together (what the executors and workers run at once): "
        "when it is full, tenants share it by weight (storage.fleet_slots); None: no fleet slot",
    )
    tier_capacity: str | None = Field(
        None,
        pattern=r"^(high|normal|low)=[1-9][0-9]*(,(high|normal|low)=[1-9][0-9]*)*$",
        description="what each tier's runners run at once (high=12,normal=10,low=8: AWS's per-tier event source "
        "maximum concurrency): a tenant's running tasks of a tier never exceed fair_limit of it (storage.tier_slots); "
        "None: no tier slot",
    )

    workspace_max_bytes: int | None = Field(
        None,
        ge=1,
        le=1 << 40,
        description="a task workspace's bytes of files, and the most a task may ask for; "
        "None: core.workspace.WorkspaceQuota's (1 GiB)",
    )
    workspace_max_files: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="a task workspace's entries (files, directories, links), and the most "
        "a task may ask for; None: core.workspace.WorkspaceQuota's (100,000)",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Defaults:
        values = {name: environ[var] for name, var in ENVIRONMENT.items() if environ.get(var, "").strip()}
        try:
            return cls.model_validate({name: value.strip() for name, value in values.items()})
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            var = ENVIRONMENT[str(first["loc"][0])]
            raise ConfigurationError(
                f"{var}: {first['msg']} (got {values[str(first['loc'][0])]!r})", field=var
            ) from None

    def env(self) -> dict[str, str]:
        """The variables that rebuild these defaults in another process."""
        return {ENVIRONMENT[name]: str(value) for name, value in self.model_dump().items() if value is not None}

    def apply(self, submission: TaskSubmission) -> TaskSubmission:
        """``submission`` with every constraint the caller left out set to this deployment's
        default. Fields the caller sent are kept as sent."""
        self.check_workspace(submission)
        given = submission.constraints.model_fields_set if "constraints" in submission.model_fields_set else set()
        fill = {
            name: getattr(self, name)
            for name in CONSTRAINT_FIELDS
            if name not in given and getattr(self, name) is not None
        }
        tiers = (self.economy_tiers or "").split(",")
        economy = submission.provider == "anthropic" and submission.priority in tiers and "economy" not in given
        if economy:
            fill["economy"] = True
        if not fill:
            return submission
        constraints = Constraints.model_validate({**submission.constraints.model_dump(include=given), **fill})
        return submission.model_copy(update={"constraints": constraints})

    def workspace_quota(self) -> WorkspaceQuota:
        """The per-task workspace limits every task of this deployment runs under."""
        base = WorkspaceQuota()
        return WorkspaceQuota(
            max_bytes=self.workspace_max_bytes or base.max_bytes, max_files=self.workspace_max_files or base.max_files
        )

    def check_workspace(self, submission: TaskSubmission) -> None:
        """A task may ask for smaller workspace limits than the deployment's, never larger."""
        spec, quota = submission.workspace, self.workspace_quota()
        if spec is None:
            return
        for name, asked, most in (("max_bytes", spec.max_bytes, quota.max_bytes),
                                  ("max_files", spec.max_files, quota.max_files)):  # fmt: skip
            if asked is not None and asked > most:
                raise ValidationError(
                    f"workspace.{name}: {asked} is more than this deployment allows a task ({most}, "
                    f"{ENVIRONMENT['workspace_' + name]}); ask for at most that, or leave it out",
                    field=f"workspace.{name}",
                )

    def fair_for(self, runs: int) -> Defaults:
        """These defaults, fair by default under a fleet that runs ``runs`` tasks at once: the
        fleet capacity, when left out, is ``runs``; the tenant running limit, when left out, is
        ``fair_limit`` of the capacity. What a configuration states stays as stated. ``agentq
        dev`` applies it (``agentq_dev.stack.LocalStack.fair``); a cdk.json environment gets the
        same from ``infra/settings.py``."""
        capacity = self.fleet_capacity if self.fleet_capacity is not None else runs
        if capacity < 1:
            return self
        limit = self.tenant_max_running if self.tenant_max_running is not None else fair_limit(capacity)
        return self.model_copy(update={"fleet_capacity": capacity, "tenant_max_running": limit})

    def tier_limits(self) -> dict[str, int]:
        """The most running tasks of one tenant in each tier whose capacity is known
        (``tier_capacity``): ``fair_limit`` of it, the fleet's rule applied per tier, so a burst
        in one tier leaves that tier's reserve to the other tenants. Empty: no tier slot."""
        pairs = [part.split("=") for part in (self.tier_capacity or "").split(",") if part]
        return {tier: fair_limit(int(capacity)) for tier, capacity in pairs}

    def running_slots(self, store: Storage) -> RunningSlots:
        """The deployment's running slots: ``store``'s, with this deployment's default running
        limit and its fleet capacity. Every caller that holds the defaults builds them here, so
        none passes the one and forgets the other (slots without the capacity admit past it and
        a cancel's give-back wakes no fleet waiter)."""
        return store.slots.with_default(self.tenant_max_running, self.fleet_capacity, tier_limits=self.tier_limits())

    def tenant_limits(self) -> TenantLimits | None:
        if self.tenant_hourly_tokens is None and self.tenant_hourly_usd is None:
            return None
        return TenantLimits(hourly_tokens=self.tenant_hourly_tokens, hourly_usd=self.tenant_hourly_usd)
