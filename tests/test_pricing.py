"""The price table turns usage into dollars, exactly (Decimal), by the model's own key: the id
itself, or the id with a date or a Bedrock version after it, never a sibling's."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from agentq.control.submit import submit
from agentq.core.errors import ValidationError
from agentq.core.models import Usage
from agentq.core.pricing import DEFAULT_PRICES, load_price_table
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

STORAGE = "memory"  # the submissions below need no AWS: tests/conftest.py's in-memory twin


def test_cost_uses_the_models_own_key_through_its_dated_and_bedrock_ids() -> None:
    prices = load_price_table("{}")
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert prices.cost("claude-opus-4-5-20251101", usage) == Decimal(30)
    assert prices.cost("claude-opus-4-1", usage) == Decimal(90)
    assert prices.cost("us.anthropic.claude-sonnet-4-5-20250929-v1:0", usage) == Decimal(18)
    assert prices.cost("unknown-model", usage) == Decimal(0)


def test_cache_tokens_are_priced_at_their_own_rates() -> None:
    prices = load_price_table("{}")
    usage = Usage(cache_creation_input_tokens=1_000_000, cache_read_input_tokens=1_000_000)
    assert prices.cost("claude-sonnet-4-5", usage) == Decimal("3.75") + Decimal("0.3")


def test_the_table_can_be_overridden_from_json(tmp_path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"my-model": {"input_per_mtok": "2", "output_per_mtok": "4"}}))
    prices = load_price_table(str(path))
    assert prices.cost("my-model-v2", Usage(input_tokens=500_000, output_tokens=250_000)) == Decimal(2)


@pytest.mark.parametrize(
    ("model", "input_per_mtok", "output_per_mtok"),
    [("gpt-4o-2024-05-13", "5", "15"), ("gpt-5-nano", "0.05", "0.4"), ("gpt-5-pro", "15", "120"),
     ("openai/gpt-5-pro", "15", "120"), ("claude-opus-4-6", "5", "25"), ("claude-opus-4-1", "15", "75")],
)  # fmt: skip
def test_a_model_that_only_shares_a_priced_models_prefix_is_not_priced_as_that_model(
    model: str, input_per_mtok: str, output_per_mtok: str
) -> None:
    """Any suffix after a key used to match: gpt-5-pro ($15/$120 list) and gpt-5-nano
    ($0.05/$0.40) were priced as gpt-5 ($1.25/$10), gpt-4o-2024-05-13 ($5/$15) as gpt-4o
    ($2.50/$10), claude-opus-4-6 ($5/$25) as claude-opus-4 ($15/$75): a money cap 12x short of
    the bill, or a ledger 25x over it. Unpriced (refused at submission) or its own price."""
    price = load_price_table("{}").price_for(model)
    assert price is None or (price.input_per_mtok, price.output_per_mtok) == (
        Decimal(input_per_mtok), Decimal(output_per_mtok))  # fmt: skip


@pytest.mark.parametrize("key", sorted(DEFAULT_PRICES))
def test_every_priced_model_is_priced_by_its_own_key_under_its_dated_and_bedrock_ids(key: str) -> None:
    """The suffixes a key still prices: a snapshot's date (OpenAI's, Anthropic's), a Bedrock
    version and context, ``-latest``, a region prefix, Claude's ``anthropic.``, an ARN's path."""
    prices = load_price_table("{}")
    bedrock = f"anthropic.{key}" if key.startswith("claude") else key
    ids = [key, f"{key}-2025-08-07", f"{key}-20250929", f"{key}-latest", f"{bedrock}-v1:0", f"{bedrock}-1:0",
           f"us.{bedrock}-20250929-v1:0", f"global.{bedrock}-v2:0", f"apac.{bedrock}-v1:0:300k",
           f"arn:aws:bedrock:eu-west-1:123456789012:inference-profile/eu.{bedrock}-v1:0"]  # fmt: skip
    assert {model: prices.key_for(model) for model in ids} == dict.fromkeys(ids, key)


@pytest.mark.parametrize("suffix", ["-pro", "-nano", "-2", "-1-preview", "-mini-high", ":8b", "x", "-v1:0-extra"])
def test_a_suffix_that_is_no_version_names_no_priced_model(suffix: str) -> None:
    prices = load_price_table("{}")
    assert {key: prices.price_for(key + suffix) for key in ("gpt-4.1-nano", "claude-haiku-4-5", "amazon.nova-pro")} == {
        "gpt-4.1-nano": None, "claude-haiku-4-5": None, "amazon.nova-pro": None}  # fmt: skip


@pytest.mark.parametrize(("money", "field"), [(None, "model"), (1.5, "constraints.max_cost_usd")])
def test_a_submission_naming_a_models_unpriced_sibling_is_refused_naming_the_field(
    store: Storage, registry: ToolRegistry, money: float | None, field: str
) -> None:
    """gpt-4.1-turbo is no model of the table's (it used to be charged as gpt-4.1): refused, as
    any model with no price is, a 422 naming the field, never charged at another's price."""
    constraints = {} if money is None else {"max_cost_usd": money}
    body = {"goal": "g", "provider": "openai", "model": "gpt-4.1-turbo", "constraints": constraints}
    with pytest.raises(ValidationError) as err:
        submit(store, registry, body, tenant="t")
    assert err.value.field == field and "no price for 'gpt-4.1-turbo'" in err.value.message
