"""Model prices: usage in tokens -> cost in USD, per step and per root task (the billing ledger).

Prices are per million tokens. The table is configuration, not code: override or extend it
with ``AGENTQ_PRICES`` (a JSON object, or a path to one) of the same shape.
"""

from __future__ import annotations

import json
import os
import re
from decimal import Decimal
from pathlib import Path

from pydantic import BaseModel, Field, RootModel

from agentq.core.model_ids import model_family
from agentq.core.models import Usage

MILLION = Decimal(1_000_000)


NO_MONEY_CAP = 10**15  # millionths of a dollar ($1,000,000,000): the money cap of a budget without max_cost_usd


def micros(usd: Decimal) -> int:
    """Dollars as the budget ledger counts them: whole millionths, rounded up (never under)."""
    return int((usd * MILLION).to_integral_value(rounding="ROUND_CEILING"))


def dollars(micros: int) -> Decimal:
    """Millionths of a dollar, as the ledger counts them, back in dollars (exact)."""
    return Decimal(micros) / MILLION


def usd_text(micros: int) -> str:
    """Millionths of a dollar as the API and the errors write dollars: six decimals, exact."""
    return str(dollars(micros).quantize(Decimal("0.000001")))


class ModelPrice(BaseModel):
    input_per_mtok: Decimal = Field(ge=0)
    output_per_mtok: Decimal = Field(ge=0)
    cache_write_per_mtok: Decimal | None = Field(default=None, ge=0)  # default 1.25 x input (5-minute TTL)
    cache_write_1h_per_mtok: Decimal | None = Field(default=None, ge=0)  # default 2 x input (1-hour TTL)
    cache_read_per_mtok: Decimal | None = Field(default=None, ge=0)  # default 0.1 x input

    def hold_micros(self, input_tokens: int, output_tokens: int) -> int:
        """The most a call of this size can cost, in millionths of a dollar: every input token at
        the dearest input rate (a 1-hour cache write), every output token at the output rate."""
        dearest_in = max(
            self.input_per_mtok,
            self.cache_write_per_mtok
            if self.cache_write_per_mtok is not None
            else self.input_per_mtok * Decimal("1.25"),
            self.cache_write_1h_per_mtok if self.cache_write_1h_per_mtok is not None else self.input_per_mtok * 2,
        )
        return micros((input_tokens * dearest_in + output_tokens * self.output_per_mtok) / MILLION)

    def cost(self, usage: Usage) -> Decimal:
        cache_write = (
            self.cache_write_per_mtok
            if self.cache_write_per_mtok is not None
            else self.input_per_mtok * Decimal("1.25")
        )
        cache_read = (
            self.cache_read_per_mtok if self.cache_read_per_mtok is not None else self.input_per_mtok * Decimal("0.1")
        )
        cache_write_1h = (
            self.cache_write_1h_per_mtok if self.cache_write_1h_per_mtok is not None else self.input_per_mtok * 2
        )
        writes_1h = min(usage.cache_creation_1h_input_tokens, usage.cache_creation_input_tokens)
        total = (
            usage.input_tokens * self.input_per_mtok
            + usage.output_tokens * self.output_per_mtok
            + (usage.cache_creation_input_tokens - writes_1h) * cache_write
            + writes_1h * cache_write_1h
            + usage.cache_read_input_tokens * cache_read
        )
        return total / MILLION


# What may follow a priced model's id and still name that model: a snapshot's date (OpenAI's
# ``-2024-08-06``, Anthropic's ``-20250929``), then a Bedrock version (``-v1:0``; gpt-oss's
# ``-1:0``) and a provisioned context (``:300k``), or ``-latest``. Anything else names another
# model (``gpt-5-pro`` is not ``gpt-5``), priced by its own key or not at all.
VERSION_SUFFIX = re.compile(r"(?:-\d{4}-\d{2}-\d{2}|-\d{8})?(?:-v\d+(?::\d+)?|-\d+:\d+)?(?::\d+k)?|-latest")


class PriceTable(RootModel[dict[str, ModelPrice]]):
    """Model id -> price. A key prices the id it spells, and that id with a version suffix
    (``VERSION_SUFFIX``): ``claude-sonnet-4-5`` prices ``claude-sonnet-4-5-20250929`` and Bedrock's
    ``us.anthropic.claude-sonnet-4-5-20250929-v1:0`` (an inference profile's region prefix, an
    ARN's path and Claude's ``anthropic.`` are not part of the key: ``us.amazon.nova-pro-v1:0``
    is priced as ``amazon.nova-pro``). Never a sibling: any suffix used to pass, and gpt-5-pro
    ($15/$120) was priced as gpt-5 ($1.25/$10), a money cap 12x short of the bill
    (``tests/test_pricing.py``); a model with no key of its own is refused at submission."""

    def key_for(self, model: str) -> str | None:
        """The key that prices ``model`` (the same key: the same model, whatever its date)."""
        name = model_family(model)
        if name.startswith("anthropic."):
            name = name.split("anthropic.", 1)[1]
        if name in self.root:
            return name
        matched = [key for key in self.root if name.startswith(key) and VERSION_SUFFIX.fullmatch(name[len(key) :])]
        return max(matched, key=len) if matched else None

    def price_for(self, model: str) -> ModelPrice | None:
        key = self.key_for(model)
        return self.root[key] if key is not None else None

    def same_model(self, one: str, other: str) -> bool:
        """Whether two ids name one model: spelled alike, or priced by one key (a dated id, a
        Bedrock one): ``gpt-4.1-mini-2025-04-14`` is ``gpt-4.1-mini``, ``gpt-4.1`` is not."""
        if model_family(one) == model_family(other):
            return True
        key = self.key_for(one)
        return key is not None and key == self.key_for(other)

    def dearest(self, models: list[str]) -> ModelPrice | None:
        """A price no call to any of ``models`` can cost more than, rate by rate: what a hold
        for a task with fallbacks is sized on, so whichever model answers, the hold covers it.
        None when the first (the task's own model) has no price, as ``price_for``."""
        prices = [p for p in (self.price_for(m) for m in models) if p is not None]
        if not models or self.price_for(models[0]) is None:
            return None
        if len(prices) == 1:
            return prices[0]

        def rate(price: ModelPrice, name: str, default: Decimal) -> Decimal:
            value = getattr(price, name)
            return value if value is not None else price.input_per_mtok * default

        return ModelPrice(
            input_per_mtok=max(p.input_per_mtok for p in prices),
            output_per_mtok=max(p.output_per_mtok for p in prices),
            cache_write_per_mtok=max(rate(p, "cache_write_per_mtok", Decimal("1.25")) for p in prices),
            cache_write_1h_per_mtok=max(rate(p, "cache_write_1h_per_mtok", Decimal(2)) for p in prices),
            cache_read_per_mtok=max(rate(p, "cache_read_per_mtok", Decimal("0.1")) for p in prices),
        )

    def cost(self, model: str, usage: Usage) -> Decimal:
        price = self.price_for(model)
        return price.cost(usage) if price else Decimal(0)


def _flat(input_: str, output: str, cached: str | None) -> dict[str, str]:
    """A model whose cache writes cost what uncached input does (OpenAI, Bedrock's non-Claude
    models): no 1.25x or 2x write surcharge, so a hold is not sized on one either. Reads cost
    ``cached`` (or the input price where the model has no prompt cache)."""
    return {"input_per_mtok": input_, "output_per_mtok": output, "cache_write_per_mtok": input_,
            "cache_write_1h_per_mtok": input_, "cache_read_per_mtok": cached or input_}  # fmt: skip


# Each model by its own id: a key prices only its dated and Bedrock ids (``VERSION_SUFFIX``),
# so a family member (claude-opus-4-6, gpt-5-nano) is a key of its own, at its own price.
DEFAULT_PRICES: dict[str, dict[str, str]] = {
    # Anthropic's list prices (https://platform.claude.com/docs/en/about-claude/pricing and each
    # model's overview page, read 2026-12-07); cache writes and reads at ModelPrice's defaults.
    **{
        model: {"input_per_mtok": input_, "output_per_mtok": output}
        for model, (input_, output) in {
            "claude-opus-4": ("15", "75"),
            "claude-opus-4-0": ("15", "75"),
            "claude-opus-4-1": ("15", "75"),
            "claude-opus-4-5": ("5", "25"),
            "claude-opus-4-6": ("5", "25"),
            "claude-opus-4-7": ("5", "25"),
            "claude-opus-4-8": ("5", "25"),
            "claude-sonnet-4": ("3", "15"),
            "claude-sonnet-4-0": ("3", "15"),
            "claude-sonnet-4-5": ("3", "15"),
            "claude-sonnet-4-6": ("3", "15"),
            "claude-3-7-sonnet": ("3", "15"),
            "claude-haiku-4-5": ("1", "5"),
            "claude-3-5-haiku": ("0.8", "4"),
        }.items()
    },
    # Provider openai: OpenAI's list prices (https://developers.openai.com/api/docs/pricing and
    # each model's page, read 2026-12-07); cached input as OpenAI bills it (a model it lists no
    # cached price for bills it as input), writes at no surcharge.
    **{
        model: _flat(input_, output, cached)
        for model, (input_, output, cached) in {
            "gpt-4.1": ("2", "8", "0.5"),
            "gpt-4.1-mini": ("0.4", "1.6", "0.1"),
            "gpt-4.1-nano": ("0.1", "0.4", "0.025"),
            "gpt-4o": ("2.5", "10", "1.25"),
            "gpt-4o-2024-05-13": ("5", "15", None),  # the first gpt-4o snapshot, at its own price
            "gpt-4o-mini": ("0.15", "0.6", "0.075"),
            "gpt-5": ("1.25", "10", "0.125"),
            "gpt-5-mini": ("0.25", "2", "0.025"),
            "gpt-5-nano": ("0.05", "0.4", "0.005"),
            "gpt-5-pro": ("15", "120", None),
            "o4-mini": ("1.1", "4.4", "0.275"),
        }.items()
    },
    # Provider bedrock-converse: Bedrock on-demand prices (us-east-1) by model id without its
    # region prefix; Nova bills cache reads at a quarter of the input price, writes at no surcharge.
    **{
        model: _flat(input_, output, cached)
        for model, (input_, output, cached) in {
            "amazon.nova-micro": ("0.035", "0.14", "0.00875"),
            "amazon.nova-lite": ("0.06", "0.24", "0.015"),
            "amazon.nova-pro": ("0.8", "3.2", "0.2"),
            "amazon.nova-premier": ("2.5", "12.5", "0.625"),
            "meta.llama3-3-70b-instruct": ("0.72", "0.72", None),
            "meta.llama4-maverick-17b-instruct": ("0.24", "0.97", None),
            "meta.llama4-scout-17b-instruct": ("0.17", "0.66", None),
            "mistral.mistral-large-2407": ("2", "6", None),
            "mistral.pixtral-large-2502": ("2", "6", None),
            "deepseek.r1": ("1.35", "5.4", None),
            "openai.gpt-oss-120b": ("0.15", "0.6", None),
            "openai.gpt-oss-20b": ("0.07", "0.3", None),
        }.items()
    },
}


def load_price_table(override: str | None = None) -> PriceTable:
    table = dict(DEFAULT_PRICES)
    raw = override if override is not None else os.environ.get("AGENTQ_PRICES")
    if raw:
        text = Path(raw).read_text() if not raw.lstrip().startswith("{") else raw
        table.update(json.loads(text))
    return PriceTable.model_validate(table)
