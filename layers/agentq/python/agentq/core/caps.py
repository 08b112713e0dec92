"""Caps at every scope: token and dollar caps per end user, per agent and per API key, per clock
hour and per UTC day, each with an optional soft threshold above which a task pauses for a
person's approval before it goes on (ARCHITECTURE 4, "spend <= cap at every scope").

A cap is the tenant's, for one scope (``user``, ``agent`` or ``key``) and one name (the user,
the agent's name, the key's id). Every call of a task acting for that scope holds on the scope's
windows before it is sent and settles the hold to what the call used after it
(``storage.scope_caps``), as the tenant's hourly window does: so ``held <= cap`` on every
window at every moment, whatever the number of workers and sub-agents racing for it.

This module is the policy's vocabulary only: what a cap is (validated so a bad one is a 4xx
naming its field and is never stored), which scopes a task spends against, and the errors that
say a cap was met. It knows nothing of storage or HTTP.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from agentq.core.call_keys import OWN_KEYS
from agentq.core.errors import AgentqError, ValidationError

if TYPE_CHECKING:
    from agentq.core.models import Task

Scope = Literal["user", "agent", "key"]
SCOPES: tuple[str, ...] = get_args(Scope)
Window = Literal["hour", "day"]
WINDOWS: tuple[Window, ...] = ("hour", "day")
Metric = Literal["tokens", "usd"]
ALERT_RATIO = 0.8  # a window crossing 80 % of its cap is told to the metrics (the stack's alarm)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+:|-]{0,127}")  # a user's, an agent's or a key id's characters
MAX_USD = Decimal(1_000_000)
MAX_TOKENS = 10**12


def check_scope(scope: str) -> Scope:
    """``scope`` if it is one, else a 4xx naming the field (an unknown scope is never stored)."""
    if scope not in SCOPES:
        raise ValidationError(f"scope: unknown scope {scope!r}: one of {', '.join(SCOPES)}", field="scope")
    return scope  # type: ignore[return-value]


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ValidationError("name: 1 to 128 characters, letters, digits and . _ @ + : | - (not first)", field="name")
    return name


class CapLimits(BaseModel):
    """One scope's caps: any of the four windows (tokens or dollars, an hour or a day), each with
    an optional soft threshold (``soft_*``) at most its cap. Null: that window is not capped.
    Token counts are strict, as every request body's numbers are: pydantic's lax mode took a
    JSON ``true`` for a cap of 1 token and ``false`` for 0, which stop every task of the scope."""

    model_config = ConfigDict(extra="forbid")

    hourly_tokens: int | None = Field(None, strict=True, ge=0, le=MAX_TOKENS, description="tokens a clock hour (UTC)")
    hourly_usd: Decimal | None = Field(None, ge=0, le=MAX_USD, decimal_places=6, description="dollars a clock hour")
    daily_tokens: int | None = Field(None, strict=True, ge=0, le=MAX_TOKENS, description="tokens a UTC day")
    daily_usd: Decimal | None = Field(None, ge=0, le=MAX_USD, decimal_places=6, description="dollars a UTC day")
    soft_hourly_tokens: int | None = Field(
        None, strict=True, ge=0, le=MAX_TOKENS, description="ask a person above this"
    )
    soft_hourly_usd: Decimal | None = Field(None, ge=0, le=MAX_USD, decimal_places=6)
    soft_daily_tokens: int | None = Field(None, strict=True, ge=0, le=MAX_TOKENS)
    soft_daily_usd: Decimal | None = Field(None, ge=0, le=MAX_USD, decimal_places=6)

    @field_validator("soft_hourly_tokens", "soft_hourly_usd", "soft_daily_tokens", "soft_daily_usd")
    @classmethod
    def _soft_within_cap(cls, soft: int | Decimal | None, info: ValidationInfo) -> int | Decimal | None:
        """A soft threshold needs its cap and is at most it (the caps are declared, so validated, first)."""
        cap = str(info.field_name).removeprefix("soft_")
        hard = info.data.get(cap)
        if soft is not None and hard is None:
            raise ValueError(f"a soft threshold needs its cap ({cap})")
        if soft is not None and hard is not None and soft > hard:
            raise ValueError(f"the soft threshold ({soft}) is above its cap ({cap} = {hard})")
        return soft

    @model_validator(mode="after")
    def _a_cap(self) -> CapLimits:
        if all(getattr(self, c) is None for c in ("hourly_tokens", "hourly_usd", "daily_tokens", "daily_usd")):
            raise ValueError("hourly_tokens, hourly_usd, daily_tokens or daily_usd: at least one cap")
        return self

    def lines(self) -> list[CapLine]:
        """The capped windows, one line each (what a hold's condition checks)."""
        out = []
        for window, prefix in (("hour", "hourly"), ("day", "daily")):
            for metric in ("tokens", "usd"):
                hard = getattr(self, f"{prefix}_{metric}")
                if hard is None:
                    continue
                soft = getattr(self, f"soft_{prefix}_{metric}")
                scale = 1_000_000 if metric == "usd" else 1  # dollars are held in millionths
                out.append(
                    CapLine(window, metric, int(hard * scale), None if soft is None else int(soft * scale))  # type: ignore[arg-type]
                )
        return out


@dataclass(frozen=True)
class CapLine:
    """One capped window of a scope, in tokens or millionths of a dollar."""

    window: Window
    metric: Metric
    cap: int
    soft: int | None


@dataclass(frozen=True)
class ScopeCap:
    """A tenant's caps for one scope and name."""

    tenant: str
    scope: Scope
    name: str
    limits: CapLimits


@dataclass(frozen=True)
class CapHold:
    """What one call holds on its scopes' windows (each ``(scope, name)``), settled after it
    (``storage.scope_caps``). The day and hour it was taken in are its own: a call settled after
    its window rolled over (a batch's answer, read hours later) settles in that window."""

    tenant: str
    scopes: tuple[tuple[str, str], ...]
    day: str
    hour: str
    amount: int
    micros: int


def scopes_of(task: Task) -> dict[Scope, str]:
    """The scopes a task spends against: its end user, its agent, the API key its tree was
    submitted with (each only when the task has one)."""
    found: dict[Scope, str] = {}
    if task.user:
        found["user"] = task.user
    if task.submission.agent:  # "name@version" once resolved: the agent's caps are the name's
        found["agent"] = task.submission.agent.partition("@")[0]
    if task.key_id:
        found["key"] = task.key_id
    return found


def counted(tenant: str, user: str) -> ScopeCap:
    """The end user's scope with no window capped: its calls hold and settle on the user's day
    item as a capped user's do, with no condition, so the item counts what the user's tasks spend
    today (held and spent) without limiting it. What a policy rule reads as
    ``history.user_spend_today_micros`` for a user without a cap (``core.engine._policy``)."""
    return ScopeCap(tenant, "user", user, CapLimits.model_construct())  # no cap: never validated, never stored


def day_key(now: float) -> str:
    return time.strftime("%Y%m%d", time.gmtime(now))


def hour_of_day(now: float) -> str:
    return time.strftime("%H", time.gmtime(now))


def seconds_to_next(window: Window, now: float) -> int:
    span = 3600 if window == "hour" else 86400
    return span - int(now) % span + 1


def approval_id(scope: Scope, window: Window, period: str) -> str:
    """The id of the approval a task asks for to go past a soft threshold: one per scope, window
    and period (a new day asks again). Under ``call_keys.OWN_KEYS``, which no tool call's
    approval is keyed under: a model whose call's id spelt it (``cap-user-day-...``, as these
    were) had its end user's approval of that call pass the tenant's threshold. One asked under
    the old id by a task in flight at the deploy is asked again, of the tenant."""
    return f"{OWN_KEYS}cap-{scope}-{window}-{period}"


class CapNotFound(AgentqError):
    code = "cap_not_found"


class CapReached(AgentqError):
    """A scope's cap would be passed by the call's hold: the task waits for the window to roll
    over (or the cap to be raised), holding nothing."""

    code = "cap_reached"

    def __init__(self, message: str, retry_after: int, scope: Scope, window: Window) -> None:
        super().__init__(message)
        self.retry_after, self.scope, self.window = retry_after, scope, window


class SoftCapReached(AgentqError):
    """A scope's soft threshold would be passed: the task pauses for a person's approval
    (``approval_id``) before this and the window's later calls go on."""

    code = "cap_soft_threshold"

    def __init__(self, message: str, scope: Scope, window: Window, period: str) -> None:
        super().__init__(message)
        self.scope, self.window, self.period = scope, window, period

    @property
    def approval(self) -> str:
        return approval_id(self.scope, self.window, self.period)
