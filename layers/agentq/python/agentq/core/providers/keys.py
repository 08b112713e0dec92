"""Where a provider's API key comes from (Anthropic, OpenAI): the environment on a laptop,
Secrets Manager in AWS.

A key in a Lambda environment variable is visible to anyone who can read the function's
configuration and cannot be rotated without a deploy; the stack instead names a secret
(``AGENTQ_ANTHROPIC_API_KEY_SECRET``: a name or ARN) that only the task runners may read.
powertools' parameters utility caches the value for ``KEY_MAX_AGE_SECONDS``, so a warm
container does not call Secrets Manager per LLM call and a rotated key is picked up within
that time.
"""

from __future__ import annotations

import json
import os

from agentq.core.errors import ProviderError
from agentq.core.secrets import redactable
from agentq.observe.redaction import REDACTOR

SECRET_VARIABLE = "AGENTQ_ANTHROPIC_API_KEY_SECRET"
OPENAI_SECRET_VARIABLE = "AGENTQ_OPENAI_API_KEY_SECRET"
KEY_MAX_AGE_SECONDS = 300
JSON_KEY_FIELDS = ("ANTHROPIC_API_KEY", "api_key", "apiKey")
OPENAI_JSON_KEY_FIELDS = ("OPENAI_API_KEY", "api_key", "apiKey")


def keep_out_of_text(*keys: str | None) -> None:
    """The keys a provider's client sends (an API key, a bearer token), kept by the process's
    redactor as a deployment secret is (``Redactor.keep``, never evicted): a server, gateway or
    proxy that echoes one (a 401 quoting "Incorrect API key provided: <key>") has it redacted
    from the error a task records and its retries' notices (``retry.excerpt``), from every log
    line and from every run's output. Each provider calls it when it is made, with what its
    client holds, however the key reached it (an argument, the SDK's own variable, a secret).
    A key the redactor could not find without finding ordinary text (``secrets.redactable``: a
    local server's short placeholder) is not kept: redacting it would rewrite ordinary text."""
    fresh = tuple(key for key in keys if key and redactable(key))
    if fresh:
        REDACTOR.keep(*fresh)


def anthropic_api_key() -> str | None:
    """The key to hand the SDK, or None to let it read ``ANTHROPIC_API_KEY`` itself.

    ``ANTHROPIC_API_KEY`` wins when both are set (local runs). The secret may hold the bare key
    or a JSON object with one of ``JSON_KEY_FIELDS``. A secret that cannot be read
    (``api_key_secret_unreadable``: missing, no permission, Secrets Manager unreachable) is a
    retryable provider error: the task shows the retry, comes back, and after maxReceiveCount
    ends failed with its message in the DLQ, for a redrive once the secret or its permissions
    are fixed. A secret that holds no key (``invalid_api_key_secret``) fails the task at once:
    no retry reads a key into it.
    """
    return _secret_key("ANTHROPIC_API_KEY", SECRET_VARIABLE, JSON_KEY_FIELDS, "Anthropic")


def openai_api_key() -> str | None:
    """The OpenAI (or OpenAI-compatible server's) key, as ``anthropic_api_key`` finds its:
    ``OPENAI_API_KEY`` wins; else the secret ``AGENTQ_OPENAI_API_KEY_SECRET`` names."""
    return _secret_key("OPENAI_API_KEY", OPENAI_SECRET_VARIABLE, OPENAI_JSON_KEY_FIELDS, "OpenAI")


def _secret_key(variable: str, secret_variable: str, fields: tuple[str, ...], who: str) -> str | None:
    secret_id = os.environ.get(secret_variable, "").strip()
    if os.environ.get(variable) or not secret_id:
        return None
    from aws_lambda_powertools.utilities import parameters

    try:
        value = parameters.get_secret(secret_id, max_age=KEY_MAX_AGE_SECONDS)
    except parameters.exceptions.GetParameterError as exc:
        raise ProviderError(
            f"cannot read the {who} API key from secret {secret_id!r}: {exc}",
            retryable=True,
            code="api_key_secret_unreadable",
        ) from None
    return _key_from(str(value), secret_id, fields)


def _key_from(value: str, secret_id: str, fields: tuple[str, ...] = JSON_KEY_FIELDS) -> str:
    text = value.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            for name in fields:
                if isinstance(data.get(name), str) and data[name].strip():
                    return str(data[name]).strip()
        raise ProviderError(
            f"secret {secret_id!r} holds JSON without a string field {' or '.join(fields)}",
            retryable=False,
            code="invalid_api_key_secret",
        )
    if not text:
        raise ProviderError(f"secret {secret_id!r} is empty", retryable=False, code="invalid_api_key_secret")
    return text
