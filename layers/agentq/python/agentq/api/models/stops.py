"""Stops (``/stops``): one scope of the caller's tenant stopped (its tasks cancelled, new ones
refused with 423) until it is resumed (docs/API.md#stopping-a-scope)."""

from __future__ import annotations

from pydantic import Field

from agentq.api.models.base import ApiModel
from agentq.core.models.strict import StrictModel
from agentq.core.stops import MAX_REASON_CHARS, VALUE_PATTERNS


def _value(kind: str, what: str) -> str | None:
    return Field(default=None, min_length=1, max_length=128, pattern=VALUE_PATTERNS[kind], description=what)


class StopScopeBody(StrictModel):
    """Exactly one scope: a user, an agent, a key or the tenant (another field is 422 naming it)."""

    user: str | None = _value("user", "an end user of the tenant")
    agent: str | None = _value("agent", "an agent's name: every version of it")
    key: str | None = _value("key", "an API key id of the tenant (key_...): the tasks submitted with it")
    tenant: str | None = _value("tenant", "the caller's own tenant: all of it")

    def fields(self) -> dict[str, str | None]:
        return {"user": self.user, "agent": self.agent, "key": self.key, "tenant": self.tenant}


class StopRequest(StopScopeBody):
    reason: str = Field(default="", max_length=MAX_REASON_CHARS, description="why (kept with the stop, and in each "
                        "cancelled task's error)")  # fmt: skip


class StopView(ApiModel):
    kind: str = Field(description="tenant, user, agent or key")
    value: str
    stopped_at: float
    by: str | None = Field(default=None, description="the API key that stopped it")
    reason: str = ""


class StopResult(ApiModel):
    stop: StopView
    created: bool = Field(description="false: the scope was stopped already (its stop kept; its tasks swept again)")
    cancelled: list[str] = Field(description="every task this request cancelled, sub-agents included")
    were_running: list[str] = Field(
        description="those a worker was running: it stops at its next step boundary, where its commit is refused; "
        "a side effect in flight is left as a cancel leaves it"
    )


class StopList(ApiModel):
    stops: list[StopView]


class ResumeResult(ApiModel):
    resumed: StopView
