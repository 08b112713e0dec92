"""A task's hard limits (``Constraints``): budget, steps, time, tools and their policies,
nesting, approvals, context management, thinking. The root budget is a root task's ``max_tokens``.

The bounds of the limits an agent may default (``core.agents.AgentConstraints``) and the types
of its tool allowlist and policies are declared here once, for both: an agent's default is
refused exactly when the task's own value would be."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from agentq.core.models.strict import StrictModel

MAX_TIMEOUT_SECONDS = 24 * 3600
MAX_DEPTH = 10  # how deep a tree of sub-agents may be: a correction walks up at most this far
MAX_TOKENS = 1_000_000_000  # a task's own token cap (a raise may take a root's budget past it)
MAX_COST_USD = Decimal(1_000_000)  # a task's own money cap (a raise may take a root's budget past it)
# ``ask``: each call waits for a person, whoever may act on the task (its end user's token too);
# ``ask_tenant``: only the tenant's API keys decide it (an operator's check on what the user's
# task does, which that user's token may neither approve nor reject: ``core.endusers``).
ToolPolicy = Literal["allow", "ask", "ask_tenant", "deny"]
ASKS: frozenset[str] = frozenset({"ask", "ask_tenant"})  # the policies whose calls wait for a person
ApprovalDefault = Literal["reject", "approve"]
Effort = Literal["low", "medium", "high", "xhigh", "max"]


def unique_tool_names(tools: list[str]) -> list[str]:
    """A pydantic validator for a tool allowlist (submissions and agents)."""
    if len(set(tools)) != len(tools):
        raise ValueError("tool names must be unique")
    return tools


# A tool allowlist and its policies: a task's (``Constraints``) and an agent's (``AgentSpec``).
ToolNames = Annotated[list[str], Field(max_length=64), AfterValidator(unique_tool_names)]
ToolPolicies = Annotated[dict[str, ToolPolicy], Field(max_length=64)]

# The bounds of each limit an agent may default. Numbers are strict: pydantic's lax mode took a
# JSON ``true`` for 1 (``max_steps: true`` ran one turn) and ``"5"`` for 5.
MAX_TOKENS_BOUNDS: Any = Field(strict=True, ge=1, le=MAX_TOKENS)
MAX_STEPS_BOUNDS: Any = Field(strict=True, ge=1, le=10_000)
TIMEOUT_SECONDS_BOUNDS: Any = Field(strict=True, ge=1, le=MAX_TIMEOUT_SECONDS)
MAX_OUTPUT_TOKENS_BOUNDS: Any = Field(strict=True, ge=1, le=128_000)
MAX_DEPTH_BOUNDS: Any = Field(strict=True, ge=0, le=MAX_DEPTH)
MAX_FANOUT_BOUNDS: Any = Field(strict=True, ge=1, le=100)
APPROVAL_TIMEOUT_SECONDS_BOUNDS: Any = Field(strict=True, ge=1, le=MAX_TIMEOUT_SECONDS)
THINKING_BUDGET_TOKENS_BOUNDS: Any = Field(strict=True, ge=1024, le=128_000)


class Constraints(StrictModel):
    """Hard limits of one task. ``max_tokens`` is the root budget when the task is a root.

    Numbers are strict (``strict=True``), as in every request body's model: pydantic's lax mode
    took a JSON ``true`` for 1 (``max_steps: true`` ran one turn) and ``"5"`` for 5."""

    max_tokens: Annotated[int, MAX_TOKENS_BOUNDS] = 200_000
    max_cost_usd: Decimal | None = Field(
        default=None,
        gt=0,
        le=MAX_COST_USD,
        decimal_places=6,
        description="the most the task (its sub-agents included) may spend, in US dollars, priced by the "
        "deployment's price table: reserved before each call at the most it can cost, settled at what it did",
    )
    max_steps: Annotated[int, MAX_STEPS_BOUNDS] = Field(default=50, description="LLM turns allowed")
    timeout_seconds: Annotated[int, TIMEOUT_SECONDS_BOUNDS] = 3600
    tools: ToolNames = Field(default_factory=list, description="tool allowlist")
    max_output_tokens: Annotated[int, MAX_OUTPUT_TOKENS_BOUNDS] = Field(default=4096, description="per LLM call")
    max_depth: Annotated[int, MAX_DEPTH_BOUNDS] = Field(
        default=3, description="sub-agent nesting allowed below the root"
    )
    max_fanout: Annotated[int, MAX_FANOUT_BOUNDS] = Field(default=10, description="children per spawn_subagents call")
    tool_policies: ToolPolicies = Field(
        default_factory=dict,
        description=(
            "per tool of `tools`: allow (the default), ask (each call waits for a person's approve or "
            "reject before it runs; a rejected call never runs; the task's end user's token may decide it), "
            "ask_tenant (the same, decided only by the tenant's API keys: an end user's token is 403) or deny "
            "(never offered, never run)"
        ),
    )
    approval_timeout_seconds: Annotated[int | None, APPROVAL_TIMEOUT_SECONDS_BOUNDS] = Field(
        default=None,
        description="an approval (an `ask` tool's or request_approval's) undecided this long takes "
        "`approval_default`; unset: it waits for a person (or the task's timeout)",
    )
    approval_default: ApprovalDefault = Field(
        default="reject", description="the decision a timed-out approval takes (reject: the call never runs)"
    )
    context_threshold: float = Field(
        strict=True,
        default=0.7,
        ge=0.1,
        le=0.95,
        description="share of the model's context window past which old tool results are cleared from what is "
        "sent (they stay in the steps; the model can recall them)",
    )
    keep_tool_results: int = Field(
        strict=True, default=5, ge=0, le=1000, description="tool results never cleared: the latest"
    )
    economy: bool = Field(
        default=False,
        description="send each LLM turn through the provider's Message Batches API at half price: the task waits, "
        "holding no compute, until the turn's result is in (minutes, at most 24 hours); Anthropic only",
    )
    compaction: Literal["summary", "native", "off"] = Field(
        default="summary",
        description="when clearing old tool results is not enough: summary (a compaction call writes a summary "
        "the conversation goes on from, committed as its own step), native (Anthropic's server-side compaction, "
        "compact_20260112: its compaction block is kept in the step and sent back) or off (sent as it is)",
    )
    thinking_budget_tokens: Annotated[int | None, THINKING_BUDGET_TOKENS_BOUNDS] = Field(
        default=None,
        description="extended thinking: output tokens per call the model may think with (below max_output_tokens)",
    )
    effort: Effort | None = Field(
        default=None, description="how much effort the model puts into each response (the API's output_config.effort)"
    )

    @model_validator(mode="after")
    def _thinking_fits(self) -> Constraints:
        if self.thinking_budget_tokens is not None and self.thinking_budget_tokens >= self.max_output_tokens:
            raise ValueError(
                f"thinking_budget_tokens: {self.thinking_budget_tokens} must be below max_output_tokens "
                f"({self.max_output_tokens}), which it is part of"
            )
        return self
