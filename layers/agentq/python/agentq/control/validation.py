"""Checking a request before anything is written: a submission, or an agent version
(``control.agents``), against this deployment (its tools, priced models, scripts and the
model's context window). A bad request is refused with a ValidationError naming the first bad
field in dotted form, so a caller learns what to fix and nothing was stored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import pydantic

from agentq.core.errors import ValidationError
from agentq.core.models import ModelChoice, OutcomeSpec, Script, TaskSubmission
from agentq.core.output import FINAL_ANSWER_TOOL
from agentq.core.pricing import load_price_table
from agentq.core.providers.features import check_features
from agentq.core.providers.scripted import load_script
from agentq.core.tools import ToolRegistry

M = TypeVar("M", bound=pydantic.BaseModel)


def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + str(part)
    return path


def parse_submission(raw: Any) -> TaskSubmission:
    """Validate a submission; the error names the first bad field in dotted form."""
    return validate_body(TaskSubmission, raw, what="the submission")


def validate_body(model: type[M], raw: Any, *, what: str) -> M:
    """``raw`` as ``model``, or a ValidationError naming the first bad field in dotted form."""
    if not isinstance(raw, dict):
        raise ValidationError(f"{what} must be a JSON object", field="body")
    try:
        return model.model_validate(raw)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(
            p for p in first["loc"] if not (isinstance(p, str) and p.startswith(("function-", "Script", "str")))
        )
        field = _field_path(loc)
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown field"
        # A model-level check names its field as "field: message" (pydantic gives no loc).
        head, sep, rest = message.partition(": ")
        if sep and head.isidentifier():
            field = ".".join(filter(None, [field, head]))
            message = rest
        field = field or "body"
        raise ValidationError(f"{field}: {message}", field=field) from None


def check_submission(submission: TaskSubmission, tools: ToolRegistry) -> None:
    """Checks that need the worker's world: known tools, a loadable script, a priced model.

    A model the price table does not know would be charged $0 to the ledger: it is refused,
    unless the deployment prices it (``AGENTQ_PRICES``). The scripted provider spends nothing,
    so its model name is not checked, unless a money budget (``max_cost_usd``) needs its price.
    """
    check_model(submission.provider, submission.model, money=submission.constraints.max_cost_usd is not None)
    if submission.notify is not None:
        from agentq.core.webhooks import check_url

        check_url(submission.notify.url)
    c = submission.constraints
    check_features(
        submission.provider, submission.model, compaction=c.compaction, economy=c.economy,
        thinking=c.thinking_budget_tokens, effort=c.effort,
    )  # fmt: skip
    check_fallbacks(submission.fallbacks, money=c.max_cost_usd is not None, compaction=c.compaction,
                    economy=c.economy, thinking=c.thinking_budget_tokens, effort=c.effort)  # fmt: skip
    if submission.mcp_tools:
        from agentq.core.tools.mcp import mcp_tool_specs

        tools = tools.with_tools(mcp_tool_specs(submission.mcp_tools, None))
    if submission.remote_agents:
        from agentq.core.remote_agents import remote_tool_specs

        tools = tools.with_tools(remote_tool_specs(submission.remote_agents))
    if submission.memory:  # its attachments' tools may be named too, to give one a policy (memory_write: ask)
        from agentq.core.tools.memory import memory_tools

        tools = tools.with_tools(memory_tools(submission.memory))
    check_tools(submission.constraints.tools, submission.constraints.tool_policies, tools, prefix="constraints.")
    if submission.output_schema is not None and FINAL_ANSWER_TOOL in submission.constraints.tools:
        raise ValidationError(
            f"constraints.tools: {FINAL_ANSWER_TOOL!r} is how a task with an output_schema answers; "
            "a tool of that name cannot be offered too",
            field="constraints.tools",
        )
    check_script(submission.script)
    check_outcome(submission.outcome, submission.provider, submission.model, tools)
    if submission.online is not None:
        check_outcome(submission.online.grade, submission.provider, submission.model, tools, prefix="online.grade")
    check_context(submission)


def check_outcome(
    outcome: OutcomeSpec | None, provider: str, model: str, tools: ToolRegistry, *, prefix: str = "outcome"
) -> None:
    """An outcome's grader is one this deployment's tool modules declare, and its rubric's
    grading model (the outcome's own, else the task's) is priced, or scripted with a script."""
    if outcome is None:
        return
    if outcome.grader is not None and tools.grader(outcome.grader) is None:
        known = ", ".join(sorted(tools.grader_names())) or "(none: declare one with @grader in a tool module)"
        raise ValidationError(
            f"{prefix}.grader: unknown grader {outcome.grader!r}; available: {known}", field=f"{prefix}.grader"
        )
    if outcome.rubric is None:
        return
    grading_provider, grading_model = outcome.grading_model(provider, model)
    if grading_provider == "scripted" and outcome.script is None:
        raise ValidationError(
            f"{prefix}.script: required when the grading model's provider is 'scripted' (set {prefix}.provider and "
            f"{prefix}.model to grade with a real model)",
            field=f"{prefix}.script",
        )
    if grading_provider != "scripted" and outcome.script is not None:
        raise ValidationError(f"{prefix}.script: only valid when the grading model's provider is 'scripted'",
                              field=f"{prefix}.script")  # fmt: skip
    if outcome.script is not None:
        try:
            load_script(outcome.script)
        except (ValueError, pydantic.ValidationError) as exc:
            raise ValidationError(f"{prefix}.script: {exc}", field=f"{prefix}.script") from None
    check_model(grading_provider, grading_model, field=f"{prefix}.model")


def check_context(submission: TaskSubmission) -> None:
    """The system prompt and tool list alone must fit under the context threshold, or no call
    could ever be made."""
    from agentq.core.context import context_window
    from agentq.core.engine.conversation import estimate_input_tokens
    from agentq.core.providers import LLMRequest

    window = context_window(submission.model)
    limit = int(window * submission.constraints.context_threshold)
    fixed = estimate_input_tokens(
        LLMRequest(model=submission.model, system=submission.system, messages=[{"role": "user", "content": submission.goal}],
                   max_tokens=1)
    )  # fmt: skip
    if fixed > limit:
        raise ValidationError(
            f"constraints.context_threshold: the system prompt and goal alone are ~{fixed:,} tokens, over "
            f"{submission.constraints.context_threshold} of {submission.model}'s {window:,}-token window ({limit:,})",
            field="constraints.context_threshold",
        )


# Where a price table setting counts: the API that checks a submission and the workers that
# charge its calls read it, never the shell that submits (which is where a person tries first).
PRICES_WHERE = (
    "AGENTQ_PRICES in the environment of the API and the workers (locally: of `agentq dev`, not of the shell "
    "that submits; see docs/MODEL_CALLS.md)"
)


def check_model(provider: str, model: str, *, money: bool = False, field: str = "model") -> None:
    if provider == "scripted" and not money:
        return
    prices = load_price_table()
    if prices.price_for(model) is None:
        if money:
            raise ValidationError(
                f"constraints.max_cost_usd: no price for {model!r}, so a money budget could not be kept; "
                f"priced models: {', '.join(sorted(prices.root))}; price another with {PRICES_WHERE}",
                field="constraints.max_cost_usd",
            )
        raise ValidationError(
            f"{field}: no price for {model!r}, so its cost could not be counted; priced models: "
            f"{', '.join(sorted(prices.root))} (and their dated or Bedrock ids); price another with {PRICES_WHERE}",
            field=field,
        )


def check_fallbacks(
    fallbacks: list[ModelChoice], *, money: bool = False, economy: bool = False, **constraints: Any
) -> None:
    """Every fallback is priced, and can honour the task's constraints as its own model must
    (a fallback that silently dropped thinking or native compaction would change the task)."""
    if fallbacks and economy:
        raise ValidationError(
            "fallbacks: an economy task's turns wait in a batch at the provider, they never fail over; "
            "leave out fallbacks or economy",
            field="fallbacks",
        )
    for i, choice in enumerate(fallbacks):
        check_model(choice.provider, choice.model, money=money, field=f"fallbacks[{i}].model")
        try:
            check_features(choice.provider, choice.model, **constraints)
        except ValidationError as exc:
            raise ValidationError(f"{exc.message} (fallbacks[{i}]: {choice.provider}/{choice.model})",
                                  field=exc.field) from None  # fmt: skip


def check_tools(names: list[str], policies: Mapping[str, str], tools: ToolRegistry, *, prefix: str) -> None:
    """Every tool named is one this deployment has; every policy is for one of them."""
    for i, name in enumerate(names):
        if tools.get(name) is None:
            raise ValidationError(
                f"{prefix}tools[{i}]: unknown tool {name!r}; available: {', '.join(sorted(tools.names()))}",
                field=f"{prefix}tools[{i}]",
            )
    for name in policies:
        if name not in names:
            raise ValidationError(
                f"{prefix}tool_policies.{name}: a policy for a tool the task may not use; "
                f"its tools: {', '.join(names) or '(none)'}",
                field=f"{prefix}tool_policies.{name}",
            )


def check_script(script: Script | str | None) -> None:
    if script is None:
        return
    try:
        load_script(script)
    except (ValueError, pydantic.ValidationError) as exc:
        raise ValidationError(f"script: {exc}", field="script") from None
