"""LLM providers behind one interface, and the factory that picks one for a task."""

from __future__ import annotations

import os
from collections.abc import Callable

from agentq.core.errors import ProviderError
from agentq.core.models import TaskSubmission
from agentq.core.providers.base import LLMProvider, LLMRequest, LLMResponse, max_call_seconds
from agentq.core.providers.keys import anthropic_api_key, openai_api_key
from agentq.core.providers.scripted import ScriptedProvider, load_script

ProviderFactory = Callable[[TaskSubmission], LLMProvider]


def default_provider_factory(submission: TaskSubmission) -> LLMProvider:
    """Scripted tasks get their script; the others read their settings from the environment,
    each SDK's own convention (ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL; OPENAI_API_KEY /
    OPENAI_BASE_URL; AWS_REGION and AWS_ENDPOINT_URL_BEDROCK_RUNTIME for Converse, which never
    takes the global AWS_ENDPOINT_URL), and in AWS
    the API keys from Secrets Manager (``anthropic_api_key``, ``openai_api_key``)."""
    if submission.provider == "scripted":
        assert submission.script is not None
        try:
            script = load_script(submission.script)
        except (OSError, ValueError) as exc:  # gone, unreadable or not a script: as it will be next time
            raise ProviderError(
                f"script: cannot load {_shown(submission.script)}: {exc}"[:500], retryable=False, code="invalid_script"
            ) from None
        return ScriptedProvider(script)
    timeout = max_call_seconds()  # one attempt cannot outlive the budget hold it spends
    if submission.provider == "openai":
        from agentq.core.providers.openai_provider import BASE_URL_VARIABLE, OpenAIProvider

        return OpenAIProvider(api_key=openai_api_key(), base_url=os.environ.get(BASE_URL_VARIABLE), timeout=timeout)
    if submission.provider == "bedrock-converse":
        from agentq.core.providers.bedrock_converse import BedrockConverseProvider

        return BedrockConverseProvider(timeout=timeout)
    from agentq.core.providers.anthropic_provider import AnthropicProvider, BedrockProvider

    if submission.provider == "anthropic":
        return AnthropicProvider(
            api_key=anthropic_api_key(), base_url=os.environ.get("ANTHROPIC_BASE_URL"), timeout=timeout
        )
    return BedrockProvider(base_url=os.environ.get("AGENTQ_BEDROCK_BASE_URL"), timeout=timeout)


def _shown(script: object) -> str:
    return repr(script)[:200] if isinstance(script, str) else "the inline script"


__all__ = [
    "LLMProvider",
    "LLMRequest",
    "LLMResponse",
    "ProviderFactory",
    "ScriptedProvider",
    "anthropic_api_key",
    "default_provider_factory",
    "load_script",
    "openai_api_key",
]
