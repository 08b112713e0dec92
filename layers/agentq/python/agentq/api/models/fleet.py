"""What a tenant and an operator read of the fleet: running slots and waiters per tenant,
spend, the circuit breakers, the dead letters and their redrive."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from agentq.api.models.base import (
    ApiModel,
)
from agentq.api.models.caps import CapView
from agentq.core.models import (
    Priority,
    StrictModel,
    TaskStatus,
)

MAX_REDRIVE_IDS = 1_000  # ids one redrive may name: as many as it looks at (queueing.dlq.MAX_TENANT_REDRIVE)
MESSAGE_ID_PATTERN = r"^[A-Za-z0-9_-]+$"  # SQS's ids are UUIDs
MessageId = Annotated[str, Field(min_length=1, max_length=128, pattern=MESSAGE_ID_PATTERN)]


class TenantUsage(ApiModel):
    tenant: str
    running: int = Field(description="tasks holding one of the tenant's running slots")
    waiting: int = Field(
        description="tasks waiting queued for a slot of the tenant's or of the fleet (counted up to 1,000; a "
        "waiter cancelled meanwhile is not counted)"
    )
    max_running: int | None = Field(description="the tenant's running limit; null: unlimited")
    weight: int = Field(
        1, description="the tenant's weight in a full fleet's share (agentq tenants limit TENANT --weight N; default 1)"
    )


class UserUsage(ApiModel):
    """One end user's usage over the window of ``CallerUsage.users_since``."""

    user: str
    trees: int = Field(description="root tasks acting for the user created in the window, each with its sub-agents")
    running: int = Field(description="of those roots, how many are running now")
    known_tokens: int = Field(description="usage the provider reported for the trees' calls")
    unknown_tokens: int = Field(description="tokens counted at the holds of calls whose outcome no worker learned")
    known_usd: str
    unknown_usd: str


class CallerUsage(TenantUsage):
    users: list[UserUsage] = Field(
        default_factory=list,
        description="usage by end user over the last 24 hours, biggest spender first (trees acting for no user make "
        "no row); a caller acting as one user (a token's) sees only its own row",
    )
    users_since: float | None = Field(
        None,
        description="the start of the window the users' rows count: the whole minute 24 hours before the current "
        "one (the window moves a minute at a time, so an unchanged answer keeps its ETag)",
    )
    users_complete: bool = Field(True, description="false: the window held more trees than one read counts")
    caps: list[CapView] = Field(
        default_factory=list,
        description="the tenant's caps per end user, agent and API key with what each window holds now (a token's "
        "caller: its own user's cap only)",
    )
    operator: bool = Field(
        description="whether the caller's key is an operator's: it may read GET /usage/tenants (the console asks "
        "only then)"
    )


class SpendView(ApiModel):
    """What the caller's task trees spent over a window, by their ledgers (ARCHITECTURE 4)."""

    since: float = Field(description="the window's start: trees whose root task was created since then")
    user: str | None = Field(None, description="the end user whose trees these are; null: the whole tenant's")
    trees: int = Field(description="root tasks counted, each with its sub-agents")
    known_tokens: int = Field(description="usage the provider reported for the trees' calls")
    unknown_tokens: int = Field(
        description="tokens counted at the holds of calls whose outcome no worker learned (a worker killed mid-call, "
        "a reply cut in the middle): at most what they were allowed; whether to bill them is the deployment's choice"
    )
    known_usd: str
    unknown_usd: str
    complete: bool = Field(description="false: the window held more trees than one read counts (the newest are)")


class TenantsUsage(ApiModel):
    tenants: list[TenantUsage] = Field(
        description="every tenant that holds running slots or has a limit of its own, by name"
    )


class BreakerView(ApiModel):
    provider: str
    model: str
    state: Literal["closed", "open", "half_open"] = Field(
        description="closed: calls go; open: calls are deferred (tasks wait, not fail) until probe_after; "
        "half_open: a probe call is out, and its outcome closes or reopens it"
    )
    failures: int = Field(description="failed calls (each after its retries) counted in the current window")
    window_started_at: float | None = Field(description="when the current window of failures started")
    opened_at: float | None = Field(description="when the circuit last opened (null: closed since)")
    probe_after: float | None = Field(description="open: when a probe call may go (opened_at + the cooldown)")
    slowed_until: float | None = Field(
        description="a 429's retry-after: the fleet makes no call to this model before then"
    )


class BreakersView(ApiModel):
    breakers: list[BreakerView] = Field(
        description="each provider/model the fleet has recorded a failure or a slow-down for, by name; a model "
        "never listed has a closed circuit"
    )
    failures_to_open: int = Field(description="failed calls within window_seconds that open a circuit")
    window_seconds: float
    cooldown_seconds: float = Field(description="how long a circuit stays open before a probe")


# ------------------------------------------------------------- dead letters


class DeadLetterView(ApiModel):
    tier: Priority
    message_id: str
    task_id: str
    task_status: TaskStatus
    reason: str = Field(description="why agentq dead-lettered it (or that SQS moved it after maxReceiveCount)")
    sent_at: float = Field(description="when the message was first sent (epoch seconds)")


class DeadLetterPage(ApiModel):
    dead_letters: list[DeadLetterView] = Field(
        description="this tenant's dead letters, by tier then age; messages that name no task of this tenant "
        "(another tenant's, or unreadable ones) are not listed"
    )


class RedriveRequest(StrictModel):
    """Which dead letters a redrive moves: the ones the caller was shown. The tier may hold more
    by the time the redrive runs (dead letters that came after the listing, which nobody looked
    at), and a redrive of the whole tier moved them too. Without ``message_ids`` (no body, or
    ``{}``) it still moves every one of the tenant's, as before."""

    message_ids: list[MessageId] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REDRIVE_IDS,
        description="only these dead letters (each one's message_id from GET /dead-letters); one no longer there "
        "(redriven meanwhile) or another tenant's is not moved. Omitted: every one of this tenant's in the tier",
    )

    @field_validator("message_ids", mode="before")
    @classmethod
    def _some(cls, value: object) -> object:
        # An empty list moves nothing, and is not the omitted field (every one): say which to send.
        if value == []:
            raise ValueError("name at least one dead letter, or leave message_ids out to redrive every one")
        return value


class RedriveResult(ApiModel):
    tier: Priority
    moved: int = Field(description="messages moved back to the tier's queue")
    task_ids: list[str] = Field(description="the tasks they name, which resume at their checkpoint")
