"""Policy documents (``/policies``): a scope's Cedar rules, their versions, and a test of rules
against a sample call (docs/POLICIES.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from agentq.api.models.base import ApiModel
from agentq.core.models.strict import StrictModel
from agentq.core.policies.rules import MAX_DOCUMENT_BYTES, SCOPE_PATTERN

MAX_POLICY_CHARS = MAX_DOCUMENT_BYTES


class PolicyPut(StrictModel):
    policies: str = Field(
        max_length=MAX_POLICY_CHARS,
        description="the scope's whole rule set, in Cedar: forbid policies, each with @id, and optionally @message, "
        '@effect("deny"|"ask"), @approver("tenant"|"user") (an ask\'s) and @mode("enforce"|"log_only"). An empty '
        "text removes every rule (a version too)",
    )


class PolicyRuleView(ApiModel):
    id: str
    effect: Literal["deny", "ask"]
    mode: Literal["enforce", "log_only"] = Field(description="log_only: decides nothing, what it would is counted")
    message: str
    description: str = ""
    approver: Literal["tenant", "user"] | None = Field(
        None,
        description="an ask's @approver: who may decide the held call, tenant (only the tenant's API keys; the "
        "default) or user (the task's end user's token too); null for a deny rule",
    )


class PolicyView(ApiModel):
    scope: str
    version: int
    policies: str
    rules: list[PolicyRuleView] = Field(
        default_factory=list,
        description="each rule of the text as the engine reads it (its @id, @effect, @mode, @message, @description, "
        "an ask's @approver, defaults filled in), in order",
    )
    digest: str
    created_at: float
    created_by: str | None = Field(
        None, description="the id of the API key that wrote this version (null: a keyless local API's write)"
    )


class PolicyWritten(ApiModel):
    created: bool
    policy: PolicyView
    warnings: list[str] = Field(default_factory=list)


class PolicyList(ApiModel):
    policies: list[PolicyView]
    next_cursor: str | None = Field(
        default=None, description="a history's: pass as ?cursor= for the next page; null at the end"
    )


class PolicyCallSample(StrictModel):
    kind: Literal["tool", "mcp", "spawn", "model"] = "tool"
    tool: str = Field(default="", max_length=200, description="the tool's name: required for a tool, mcp or spawn call")
    args: dict[str, Any] = Field(default_factory=dict)
    model: str = Field(default="", max_length=200)
    mcp_server: str = Field(default="", max_length=200)
    estimated_tokens: int = Field(default=0, strict=True, ge=0, le=10**12)
    estimated_usd_micros: int = Field(default=0, strict=True, ge=0, le=10**15)

    @model_validator(mode="after")
    def _names_its_tool(self) -> PolicyCallSample:
        """A call of a tool names it: rules decide on the tool, so one naming none was allowed
        by rules it never met."""
        if self.kind != "model" and not self.tool.strip():
            raise ValueError(f"tool: a {self.kind} call names its tool (the tool's name)")
        return self


class PolicyPrincipalSample(StrictModel):
    agent: str = Field(default="", max_length=64)
    agent_version: int = Field(default=0, strict=True, ge=0, le=10**9)
    user: str | None = Field(default=None, max_length=256)
    api_key: str | None = Field(default=None, max_length=256)


class PolicyToolRun(StrictModel):
    name: str = Field(max_length=200)
    status: Literal["ok", "error", "timeout", "unknown_outcome", "replayed"] = "ok"


class PolicyHistorySample(StrictModel):
    tools: list[PolicyToolRun] = Field(default_factory=list, max_length=10_000)
    task_tokens: int = Field(default=0, strict=True, ge=0, le=10**12)
    task_spend_micros: int = Field(default=0, strict=True, ge=0, le=10**15)
    tree_tokens: int = Field(default=0, strict=True, ge=0, le=10**12)
    tree_spend_micros: int = Field(default=0, strict=True, ge=0, le=10**15)
    user_spend_today_micros: int | None = Field(default=None, strict=True, ge=0, le=10**15)


class PolicyTest(StrictModel):
    """Evaluate rules against a sample call without running anything."""

    policies: dict[str, str] = Field(
        default_factory=dict,
        max_length=2,
        description="scope -> Cedar text to test in place of the stored document of that scope (none: the stored)",
        json_schema_extra={"propertyNames": {"pattern": SCOPE_PATTERN}},
    )
    call: PolicyCallSample = Field(description="the sample call: its kind and the tool it names")
    principal: PolicyPrincipalSample = Field(default_factory=PolicyPrincipalSample)
    history: PolicyHistorySample = Field(default_factory=PolicyHistorySample)


class PolicyDecision(ApiModel):
    decision: Literal["allow", "deny", "ask"]
    reason: str | None = None
    rule: str | None = None
    version: int | None = None
    effect: str | None = None
    message: str | None = None
    approver: Literal["tenant", "user"] | None = Field(
        None, description="an ask: who may decide the held call (the rule's @approver)"
    )
    error: str | None = None
    log_only: list[dict[str, Any]] = Field(default_factory=list)


class PolicySchema(ApiModel):
    cedar_schema: dict[str, Any] = Field(description="the Cedar schema (JSON form) every rule is validated against")
