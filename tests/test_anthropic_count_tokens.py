"""The Anthropic provider counts a request's input before it is sent (``base.InputCounter``,
``core/providers/anthropic_count.py``): ``POST /v1/messages/count_tokens`` through the real
``anthropic`` SDK, against the fake Messages API, which answers what a reply would bill for the
request's input. What the engine sizes a call near the cap on (ARCHITECTURE 4)."""

from __future__ import annotations

import pytest

from agentq.core.errors import ProviderError
from agentq.core.providers import LLMRequest
from agentq.core.providers.anthropic_provider import AnthropicProvider, BedrockProvider
from agentq.core.providers.base import InputCounter
from agentq.core.providers.bedrock_converse import BedrockConverseProvider
from agentq.core.providers.features import FEATURES
from agentq.core.providers.openai_provider import OpenAIProvider
from agentq.core.providers.retry import RetryPolicy
from agentq.core.providers.scripted import ScriptedProvider

from tests.fake_messages_api import (
    FakeMessagesAPI,
    FakeReply,
    RecordedRequest,
    input_tokens,
    text_reply,
    tool_prompt_tokens,
    usage_dict,
)

REQUEST = LLMRequest(
    model="claude-sonnet-4-6", system="be brief", messages=[{"role": "user", "content": "look 4f2a9c up"}],
    tools=[{"name": "lookup", "description": "Look a digest up.", "input_schema": {"type": "object"}}],
    max_tokens=100,
)  # fmt: skip
FAST = RetryPolicy(max_attempts=3, base_delay=0, max_delay=0)


def test_the_anthropic_provider_counts_a_requests_input_as_its_call_would_be_billed() -> None:
    """The count posts the request's input as the Messages call sends it (system, messages and
    tools, their cache breakpoints too; no ``max_tokens``), and returns the server's count, the
    hidden tool prompt included: what the call's reply is billed as input (the server bills
    ``input_tokens`` of the blocks, as it counts them). The count is no Messages call."""

    def bill(request: RecordedRequest) -> FakeReply:
        return text_reply("done", usage=usage_dict(input_tokens(request.body), 1))

    with FakeMessagesAPI(responder=bill, bills_tool_prompt=True) as api:
        provider = AnthropicProvider(api_key="k", base_url=api.base_url, retry=FAST)
        assert isinstance(provider, InputCounter)
        counted = provider.count_input_tokens(REQUEST)
        [sent] = [r.body for r in api.count_requests]
        assert "max_tokens" not in sent and sent["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert [t["name"] for t in sent["tools"]] == ["lookup"] and api.delivered_usage == []
        assert counted == input_tokens(sent) + tool_prompt_tokens(sent)
        assert provider.complete(REQUEST).usage.input_total == counted


def test_a_count_that_fails_is_retried_as_a_call_is_then_fails_as_a_call_does() -> None:
    """A 500 from the count endpoint is retried under the provider's policy; past its attempts
    the count is a retryable ``ProviderError`` coded as a call's would be."""
    with FakeMessagesAPI() as api:
        provider = AnthropicProvider(api_key="k", base_url=api.base_url, retry=FAST)
        api.count_failures = 2
        assert provider.count_input_tokens(REQUEST) > 0 and len(api.count_requests) == 3
        api.count_failures = 3
        with pytest.raises(ProviderError) as failed:
            provider.count_input_tokens(REQUEST)
        assert failed.value.retryable and failed.value.code == "provider_server_error" and failed.value.attempts == 3
        assert "count_tokens" in failed.value.message and len(api.count_requests) == 6


def test_claude_on_bedrock_offers_no_count() -> None:
    """Its SDK client refuses ``count_tokens`` ("Token counting is not supported in Bedrock
    yet"): the engine sizes its calls on the estimate."""
    assert not isinstance(BedrockProvider(aws_region="us-east-1", base_url="http://127.0.0.1:9"), InputCounter)


def test_the_provider_table_says_counted_near_the_cap_for_exactly_the_providers_that_count() -> None:
    """The table the docs show (``features.FEATURES``) names the providers whose calls near the
    cap are counted: those whose provider class has ``count_input_tokens``."""
    classes = {"anthropic": AnthropicProvider, "bedrock": BedrockProvider, "bedrock-converse": BedrockConverseProvider,
               "openai": OpenAIProvider, "scripted": ScriptedProvider}  # fmt: skip
    assert set(classes) == set(FEATURES)
    said = {name for name, f in FEATURES.items() if f.token_counting == "counted near the cap"}
    assert said == {name for name, cls in classes.items() if hasattr(cls, "count_input_tokens")} == {"anthropic"}
