"""What each provider supports, declared in one table, and the check that refuses the rest.

A constraint a provider cannot honour (economy without a batch API, native compaction outside
Anthropic, thinking on a model that has none) is refused when the task is submitted or the
agent version created, naming the field: never sent and silently dropped, which would leave a
caller believing a task ran cheaper, or thought, when it did not. The README's provider table
and docs/MODEL_CALLS.md are this table in prose; ``tests/test_provider_features.py`` keeps
them equal.

``scripted`` plays a declared script in place of any model, so it accepts thinking and effort
(its turns stand for a model that would think); economy and native compaction, which change
how a call is made rather than what it answers, it refuses like any provider without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentq.core.errors import ValidationError

Support = Literal["yes", "no", "per model", "automatic", "estimate", "counted near the cap"]


@dataclass(frozen=True)
class Features:
    prompt_caching: Support  # breakpoints sent by agentq; "automatic": the server caches, usage reports it
    native_compaction: Support  # constraints.compaction = "native"
    summary_compaction: Support  # constraints.compaction = "summary": a call of its own, any model
    economy: Support  # constraints.economy: a batch API at half price
    thinking: Support  # constraints.thinking_budget_tokens
    effort: Support  # constraints.effort
    structured_output: Support  # output_schema: through the final_answer tool, so tool use is enough
    streaming: Support  # long outputs streamed (AGENTQ_STREAM_ABOVE_TOKENS)
    # How a call's budget hold is sized: "estimate" (3 characters a token over the JSON, and the
    # hidden tool prompt); "counted near the cap": a hold the cap shrank is sized on the input the
    # provider counts where that is more (``base.InputCounter``, ``core.engine._input_count``).
    token_counting: Support


FEATURES: dict[str, Features] = {
    "anthropic": Features("yes", "yes", "yes", "yes", "yes", "yes", "yes", "yes", "counted near the cap"),
    "bedrock": Features("yes", "no", "yes", "no", "yes", "yes", "yes", "yes", "estimate"),
    "bedrock-converse": Features("per model", "no", "yes", "no", "per model", "no", "yes", "yes", "estimate"),
    "openai": Features("automatic", "no", "yes", "no", "no", "no", "yes", "yes", "estimate"),
    "scripted": Features("no", "no", "yes", "no", "yes", "yes", "yes", "no", "estimate"),
}


def features(provider: str) -> Features:
    return FEATURES[provider]


# The table's rows as the docs name them (README, docs/MODEL_CALLS.md).
ROWS = {
    "prompt_caching": "prompt caching",
    "native_compaction": "compaction: native",
    "summary_compaction": "compaction: summary",
    "economy": "economy (batches)",
    "thinking": "extended thinking",
    "effort": "effort",
    "structured_output": "structured output",
    "streaming": "streaming long outputs",
    "token_counting": "token counting for holds",
}


def feature_table() -> str:
    """The table as Markdown, providers as columns: what the docs show, kept equal by a test."""
    names = list(FEATURES)
    lines = ["| feature | " + " | ".join(f"`{n}`" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for field, label in ROWS.items():
        lines.append(f"| {label} | " + " | ".join(getattr(FEATURES[n], field) for n in names) + " |")
    return "\n".join(lines)


def check_features(
    provider: str,
    model: str,
    *,
    compaction: str = "summary",
    economy: bool = False,
    thinking: int | None = None,
    effort: str | None = None,
    prefix: str = "constraints.",
) -> None:
    """Refuse what ``provider`` (and for per-model features ``model``) cannot do; the error
    names the field (``constraints.economy`` ...), prefixed as the caller's body spells it."""
    from agentq.core.providers.bedrock_converse import reasons

    have = FEATURES[provider]
    if compaction == "native" and have.native_compaction != "yes":
        raise ValidationError(
            f"{prefix}compaction: native compaction is Anthropic's (compact_20260112); the "
            f"{provider} provider has none: use summary",
            field=f"{prefix}compaction",
        )
    if economy and have.economy != "yes":
        raise ValidationError(
            f"{prefix}economy: the {provider} provider has no batch API; economy needs provider "
            "anthropic (Message Batches)",
            field=f"{prefix}economy",
        )
    thinks = have.thinking == "yes" or (have.thinking == "per model" and reasons(model))
    if thinking is not None and not thinks:
        raise ValidationError(
            f"{prefix}thinking_budget_tokens: extended thinking is not available on {provider}/{model}; "
            "leave it out, or use a Claude model",
            field=f"{prefix}thinking_budget_tokens",
        )
    if effort is not None and have.effort != "yes":
        raise ValidationError(
            f"{prefix}effort: the {provider} provider takes no effort setting (Claude's output_config.effort); "
            "leave it out",
            field=f"{prefix}effort",
        )
