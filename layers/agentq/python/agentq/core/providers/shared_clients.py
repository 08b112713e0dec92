"""One SDK client per process and setting, shared by every model call the process makes.

Why: the engine asks the provider factory for a provider at every model call
(``default_provider_factory``), and a provider used to build its SDK client there. An
``anthropic.Anthropic`` (or ``AnthropicBedrock``) or ``openai.OpenAI`` client builds an httpx
client, whose SSL context loads the CA bundle: ~35-50 ms of CPU a call. And a new client has
no connection, so every call opened a TCP connection and a TLS session of its own. The SDKs'
clients are thread-safe and meant to be shared: one per setting keeps a worker's connection to
the provider open from one call to the next, for as long as the HTTP client keeps an idle
connection (5 s) and the server does (``tests/test_shared_clients.py``;
``bench/provider_calls.py``: 38 -> 3.5 ms of CPU a call, one connection for 200 calls where
there were 200). One exception, the SDK's: ``openai`` 3.63's synchronous stream closes its
response at ``[DONE]`` without reading the chunked body's end, so a streamed OpenAI call (above
``AGENTQ_STREAM_ABOVE_TOKENS``) still opens a connection; its CPU is saved all the same.

A setting is everything the client is built from: the arguments, and the environment the SDK
and its HTTP client read when they build one (``_environment``: the variables of the SDK's own
prefix, the proxies, the CA bundle's, and for Bedrock which region or AWS profile). A rotated key, another server, another header or
proxy gets a client of its own; the least recently used of more than ``SHARED_CLIENTS`` is
dropped. A forked child starts with none: the connections it inherited are its parent's.

Bedrock Converse keeps a botocore client per setting for the same reason
(``bedrock_converse.shared_client``).
"""

from __future__ import annotations

import functools
import os
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import anthropic
    import openai

SHARED_CLIENTS = 8
# What AnthropicBedrock reads besides ANTHROPIC_*: its region (or its profile's: botocore's
# variables for which profile and config file) and its API key. A config file's contents are
# not in the key.
BEDROCK_VARIABLES = frozenset(
    {"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE",
     "AWS_BEARER_TOKEN_BEDROCK"}
)  # fmt: skip
# What the SDKs' httpx reads when it builds a client, besides the proxies (``getproxies``).
TLS_VARIABLES = frozenset({"SSL_CERT_FILE", "SSL_CERT_DIR"})

T = TypeVar("T")
Environment = tuple[tuple[str, str], ...]


def _per_process(make: Callable[..., T]) -> functools._lru_cache_wrapper[T]:
    """``make`` memoised by its arguments, at most ``SHARED_CLIENTS`` of them, forgotten in a
    forked child."""
    shared = functools.lru_cache(maxsize=SHARED_CLIENTS)(make)
    os.register_at_fork(after_in_child=shared.cache_clear)
    return shared


def _environment(prefix: str, names: frozenset[str] = frozenset()) -> Environment:
    """The environment a client of that SDK is built from, as it is now (part of the client's
    key): the variables named with its ``prefix``, ``names``, the CA bundle's, and the proxies
    as the SDKs' httpx reads them (``urllib.request.getproxies``: any capitalisation)."""
    read = names | TLS_VARIABLES
    own = sorted((k, v) for k, v in os.environ.items() if k.startswith(prefix) or k in read)
    return (*own, *sorted((f"proxy:{k}", v) for k, v in urllib.request.getproxies().items()))


def anthropic_client(api_key: str | None, base_url: str | None, timeout: float) -> anthropic.Anthropic:
    """The Anthropic API's client at ``base_url`` (None: ``ANTHROPIC_BASE_URL``, else the SDK's),
    with ``api_key`` (None: ``ANTHROPIC_API_KEY``, else ``ANTHROPIC_AUTH_TOKEN``, as the SDK
    picks)."""
    return _anthropic(api_key, base_url, timeout, _environment("ANTHROPIC_"))


@_per_process
def _anthropic(api_key: str | None, base_url: str | None, timeout: float, _: Environment) -> anthropic.Anthropic:
    import anthropic

    return anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)


def anthropic_bedrock_client(
    aws_region: str | None, base_url: str | None, timeout: float
) -> anthropic.AnthropicBedrock:
    """Claude on Bedrock's client in ``aws_region`` (None: the environment's or the AWS
    profile's), signed with the ambient AWS credentials at each request unless
    ``AWS_BEARER_TOKEN_BEDROCK`` (a Bedrock API key) is set."""
    return _anthropic_bedrock(aws_region, base_url, timeout, _environment("ANTHROPIC_", BEDROCK_VARIABLES))


@_per_process
def _anthropic_bedrock(
    aws_region: str | None, base_url: str | None, timeout: float, _: Environment
) -> anthropic.AnthropicBedrock:
    import anthropic

    return anthropic.AnthropicBedrock(aws_region=aws_region, base_url=base_url, timeout=timeout, max_retries=0)


def openai_client(api_key: str, base_url: str | None, timeout: float) -> openai.OpenAI:
    """The Chat Completions client for ``api_key`` at ``base_url`` (None: ``OPENAI_BASE_URL``,
    else OpenAI's own)."""
    return _openai(api_key, base_url, timeout, _environment("OPENAI_"))


@_per_process
def _openai(api_key: str, base_url: str | None, timeout: float, _: Environment) -> openai.OpenAI:
    import openai

    return openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)


def forget() -> None:
    """Drop every shared client (a test that must start from none; a forked child does anyway)."""
    for shared in (_anthropic, _anthropic_bedrock, _openai):
        shared.cache_clear()
