"""One SDK client per process and setting, shared by every model call the process makes.

Why: the engine asks the provider factory for a provider at every model call
(``default_provider_factory``), and a provider used to build its SDK client there. An
``anthropic.Anthropic`` (or ``AnthropicBedrock``) or ``openai.OpenAI`` client builds an httpx client, whose SSL context
loads the CA bundle: ~50 ms and ~33 ms of CPU a call. And a new client has no connection, so
every call opened a TCP connection and a TLS session of its own. The SDKs' clients are
thread-safe and meant to be shared: one per setting (key, base URL, timeout) keeps a worker's
connection to the provider alive from one call to the next (``tests/test_shared_clients.py``;
``bench/provider_calls.py``: 37 -> 3.5 ms of CPU a call, 100 -> 1 connections a hundred calls).
One exception, the SDK's: ``openai`` 3.63's synchronous stream closes its response at
``[DONE]`` without reading the chunked body's end, so a streamed OpenAI call (above
``AGENTQ_STREAM_ABOVE_TOKENS``) still opens a connection; its CPU is saved all the same.

A setting is part of the key, so a rotated key or another server gets a client of its own;
the least recently used of more than ``SHARED_CLIENTS`` goes (its connections close with it).
A forked child starts with none: the connections it inherited are its parent's.

Bedrock Converse keeps its botocore client the same way (``bedrock_converse.shared_client``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import anthropic
    import openai

SHARED_CLIENTS = 8

T = TypeVar("T")


def _per_process(make: Callable[..., T]) -> functools._lru_cache_wrapper[T]:
    """``make`` memoised by its arguments, at most ``SHARED_CLIENTS`` of them, forgotten in a
    forked child."""
    shared = functools.lru_cache(maxsize=SHARED_CLIENTS)(make)
    os.register_at_fork(after_in_child=shared.cache_clear)
    return shared


@_per_process
def anthropic_client(
    api_key: str | None, auth_token: str | None, base_url: str | None, timeout: float
) -> anthropic.Anthropic:
    """The Anthropic API's client for these credentials, at ``base_url`` (None: the SDK's)."""
    import anthropic

    return anthropic.Anthropic(
        api_key=api_key, auth_token=auth_token, base_url=base_url, timeout=timeout, max_retries=0
    )


@_per_process
def anthropic_bedrock_client(
    aws_region: str | None, base_url: str | None, bearer_token: str | None, timeout: float
) -> anthropic.AnthropicBedrock:
    """Claude on Bedrock's client in ``aws_region`` (None: the AWS profile's), signed with the
    ambient AWS credentials at each request unless ``bearer_token`` (a Bedrock API key) is given."""
    import anthropic

    return anthropic.AnthropicBedrock(
        aws_region=aws_region, base_url=base_url, api_key=bearer_token, timeout=timeout, max_retries=0
    )


@_per_process
def openai_client(api_key: str, base_url: str | None, timeout: float) -> openai.OpenAI:
    """The Chat Completions client for ``api_key`` at ``base_url`` (None: OpenAI's own)."""
    import openai

    return openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)
