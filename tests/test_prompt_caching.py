"""Prompt caching by default (Anthropic and Bedrock): the real ``anthropic`` SDK sends
breakpoints on the tools, the system prompt and the two latest messages (the API's four),
with the one-hour TTL where the task may wait longer than five minutes; the checkpointed
conversation is never changed by it; cache writes and reads are priced as the provider prices
them, by TTL."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from agentq.core.engine import cache_ttl
from agentq.core.models import Constraints, Usage
from agentq.core.pricing import load_price_table
from agentq.core.providers.anthropic_provider import AnthropicProvider
from agentq.core.providers.anthropic_reply import to_llm_response
from agentq.core.providers.base import LLMRequest
from agentq.core.providers.caching import cached_request

from tests.fake_messages_api import FakeMessagesAPI, message_reply, text_reply, usage_dict

TOOLS = [
    {"name": "lookup", "description": "look up", "input_schema": {"type": "object", "properties": {}}},
    {"name": "charge", "description": "charge", "input_schema": {"type": "object", "properties": {}}},
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "find the invoice"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "invoice 7"}]},
]


def _breakpoints(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = [("tools", t["cache_control"]) for t in body.get("tools", []) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        found += [("system", b["cache_control"]) for b in system if "cache_control" in b]
    for i, message in enumerate(body["messages"]):
        if isinstance(message["content"], list):
            found += [(f"messages[{i}]", b["cache_control"]) for b in message["content"] if "cache_control" in b]
    return found


@pytest.mark.parametrize(
    ("ttl", "control"), [("5m", {"type": "ephemeral"}), ("1h", {"type": "ephemeral", "ttl": "1h"})]
)
def test_the_sdk_sends_four_breakpoints_and_the_conversation_is_left_as_it_was(
    ttl: str, control: dict[str, Any]
) -> None:
    request = LLMRequest(model="claude-sonnet-4-6", system="You are careful.", messages=copy.deepcopy(MESSAGES),
                         tools=copy.deepcopy(TOOLS), max_tokens=100, cache_ttl=ttl)  # type: ignore[arg-type]  # fmt: skip
    with FakeMessagesAPI() as api:
        api.enqueue(text_reply("done"))
        AnthropicProvider(api_key="k", base_url=api.base_url).complete(request)
        [sent] = api.requests
    assert _breakpoints(sent.body) == [("tools", control), ("system", control), ("messages[1]", control),
                                       ("messages[2]", control)]  # fmt: skip
    assert sent.body["tools"][0] == TOOLS[0] and sent.body["system"][0]["text"] == "You are careful."
    assert request.messages == MESSAGES and request.tools == TOOLS  # what the engine stores is untouched


def test_no_breakpoints_when_caching_is_turned_off_and_no_ttl_for_bedrock(monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs = {"model": "m", "system": "s", "tools": TOOLS, "messages": MESSAGES, "max_tokens": 5}
    assert all("ttl" not in c for _, c in _breakpoints(cached_request(kwargs, None)))  # what Bedrock is sent
    monkeypatch.setenv("AGENTQ_PROMPT_CACHE", "off")
    with FakeMessagesAPI() as api:
        api.enqueue(text_reply("done"))
        AnthropicProvider(api_key="k", base_url=api.base_url).complete(
            LLMRequest(model="claude-sonnet-4-6", system="s", messages=MESSAGES, tools=TOOLS, max_tokens=5)
        )
        assert _breakpoints(api.requests[0].body) == [] and api.requests[0].body["system"] == "s"


def test_a_task_that_may_wait_for_a_person_or_its_children_caches_for_an_hour() -> None:
    assert cache_ttl(Constraints(tools=["lookup"])) == "5m"
    assert cache_ttl(Constraints(tools=["lookup", "request_approval"])) == "1h"
    assert cache_ttl(Constraints(tools=["spawn_subagents"])) == "1h"
    assert cache_ttl(Constraints(tools=["charge"], tool_policies={"charge": "ask"})) == "1h"
    assert cache_ttl(Constraints(tools=["charge"], tool_policies={"charge": "deny"})) == "5m"


def test_cache_writes_by_ttl_and_reads_are_priced_as_the_provider_prices_them() -> None:
    usage = usage_dict(
        input_tokens=100, output_tokens=50, cache_creation_input_tokens=3000, cache_read_input_tokens=20_000
    )
    usage["cache_creation"] = {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000}
    with FakeMessagesAPI() as api:
        api.enqueue(message_reply([{"type": "text", "text": "ok"}], usage=usage))
        response = AnthropicProvider(api_key="k", base_url=api.base_url).complete(
            LLMRequest(model="claude-sonnet-4-6", messages=MESSAGES, max_tokens=5)
        )
    assert response.usage == Usage(input_tokens=100, output_tokens=50, cache_creation_input_tokens=3000,
                                   cache_read_input_tokens=20_000, cache_creation_1h_input_tokens=2000)  # fmt: skip
    # Sonnet: $3 in, $15 out; writes 1.25x (5 min) and 2x (1 h); reads 0.1x
    expected = (100 * 3 + 50 * 15 + 1000 * Decimal("3.75") + 2000 * 6 + 20_000 * Decimal("0.3")) / Decimal(1_000_000)
    assert load_price_table().cost("claude-sonnet-4-6", response.usage) == expected
    assert response.usage.input_total == 23_100  # the ledger counts every input token the model read
    assert to_llm_response is not None


@pytest.mark.parametrize(("ttl", "read_after_ten_minutes"), [(None, False), ("1h", True)])
def test_the_local_cache_server_reads_a_prefix_within_its_ttl_only(
    ttl: str | None, read_after_ten_minutes: bool
) -> None:
    from tests.prompt_cache_server import CacheAccounting

    kwargs = {"model": "m", "system": "s" * 6000, "tools": TOOLS, "messages": MESSAGES, "max_tokens": 5}
    body = cached_request(kwargs, ttl)  # type: ignore[arg-type]
    cache = CacheAccounting()
    first = cache.bill(body)
    assert first is not None and first["cache_read_input_tokens"] == 0 and first["cache_creation_input_tokens"] > 1024
    again = cache.bill(body)
    assert again is not None and again["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    cache.clock += 600
    later = cache.bill(body)
    assert later is not None and (later["cache_read_input_tokens"] > 0) is read_after_ten_minutes
    plain = CacheAccounting().bill(kwargs)  # no breakpoints: nothing cached, all plain input
    assert plain is not None and plain["cache_creation_input_tokens"] == plain["cache_read_input_tokens"] == 0
