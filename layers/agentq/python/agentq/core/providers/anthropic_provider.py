"""Providers backed by the real Anthropic SDK: the Anthropic API and Amazon Bedrock.

Both go through the same ``messages.create`` call, so the engine sees one behaviour whichever
endpoint a task names; only the client construction (API key vs SigV4) differs.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import anthropic

from agentq.core.models import Usage
from agentq.core.providers.base import LLMRequest, LLMResponse
from agentq.core.providers.retry import RetryPolicy, call_with_retries

# What the engine persists and replays. Anything else the SDK adds (citations, caller,
# toolset_name, ...) would make stored steps depend on the SDK version that wrote them.
BLOCK_KEYS = ("type", "text", "id", "name", "input")

DEFAULT_TIMEOUT_SECONDS = 600.0


class _MessagesProvider:
    """Shared call path; subclasses only decide which SDK client to build."""

    name: str = ""

    def __init__(
        self,
        client: Any,
        retry: RetryPolicy,
        sleep: Callable[[float], None],
        rng: random.Random | None,
    ) -> None:
        # Even an injected client must not retry on its own: the attempts we count and the
        # delays we bound would otherwise be multiplied by the SDK's hidden loop.
        if getattr(client, "max_retries", 0) != 0:
            client = client.with_options(max_retries=0)
        self._client = client
        self.retry = retry
        self._sleep = sleep
        self._rng = rng

    def complete(self, request: LLMRequest) -> LLMResponse:
        """One assistant turn; raises ``ProviderError`` once the retry policy gives up."""
        kwargs: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": request.messages,
        }
        # Sent only when set: an empty system string or tools list is rejected by the API.
        if request.system:
            kwargs["system"] = request.system
        if request.tools:
            kwargs["tools"] = request.tools

        message, attempts = call_with_retries(
            lambda: self._client.messages.create(**kwargs),
            self.retry,
            self._sleep,
            rng=self._rng,
            label=self.name,
        )
        return to_llm_response(message, attempts)


class AnthropicProvider(_MessagesProvider):
    """The Anthropic API; ``api_key=None`` lets the SDK read ``ANTHROPIC_API_KEY``."""

    name = "anthropic"

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        client: anthropic.Anthropic | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if client is None:
            client = anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)
        super().__init__(client, retry or RetryPolicy(), sleep, rng)


class BedrockProvider(_MessagesProvider):
    """Claude on Amazon Bedrock, signed with the ambient AWS credentials (the Lambda role)."""

    name = "bedrock"

    def __init__(
        self,
        aws_region: str | None = None,
        base_url: str | None = None,
        retry: RetryPolicy | None = None,
        client: anthropic.AnthropicBedrock | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if client is None:
            client = anthropic.AnthropicBedrock(
                aws_region=aws_region, base_url=base_url, timeout=timeout, max_retries=0
            )
        super().__init__(client, retry or RetryPolicy(), sleep, rng)


def to_llm_response(message: Any, attempts: int) -> LLMResponse:
    """Turn an SDK ``Message`` into the provider-neutral shape the engine stores.

    Usage is copied field for field, never derived, because budgets and cost are charged from
    it; the cache fields are ``None`` when caching was not involved and count as zero.
    """
    content = [_plain_block(block) for block in message.content]
    usage = message.usage
    return LLMResponse(
        content=content,
        stop_reason=message.stop_reason,
        model=message.model,
        usage=Usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
            cache_read_input_tokens=usage.cache_read_input_tokens or 0,
        ),
        attempts=attempts,
    )


def _plain_block(block: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = block.model_dump(exclude_none=True)
    return {key: dumped[key] for key in BLOCK_KEYS if key in dumped}
