"""The price table turns usage into dollars, exactly (Decimal), by longest model prefix."""

from __future__ import annotations

import json
from decimal import Decimal

from agentq.core.models import Usage
from agentq.core.pricing import load_price_table


def test_cost_uses_the_longest_matching_model_prefix() -> None:
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
