"""Counting a request's input before it is sent: the Anthropic API's
``POST /v1/messages/count_tokens`` (``base.InputCounter``), what a call near the cap is sized on
(``core.engine._input_count``, ARCHITECTURE 4).

Every hold starts from an estimate (``conversation.estimate_input_tokens``: three characters a
token), which a request denser than that (digits, hashes, base64) passes; a call whose output
allowance the cap shrank to what is left past its input, writing all of it, then passed the cap
by the difference. The endpoint takes the Messages parameters that make the input (system,
messages, tools, thinking, output config; ``cache_control`` blocks as sent) and says how many
input tokens they are, the tool-use system prompt included; it bills nothing. It fails as a
Messages call does, and is retried alike (``retry.call_with_retries``, the provider's policy).

Claude on Bedrock through the same SDK cannot count (its client refuses the path: "Token
counting is not supported in Bedrock yet"), so only ``AnthropicProvider`` offers it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from agentq.core.providers.pages import parsed_or_page
from agentq.core.providers.retry import Classifier, MalformedReply, RetryPolicy, call_with_retries

# The parameters of a Messages call that the endpoint counts: the rest (max_tokens, stream, a
# beta's context management) bill no input of their own.
COUNTED = ("model", "system", "messages", "tools", "thinking", "output_config")


def count_input(
    client: Any,
    params: dict[str, Any],
    retry: RetryPolicy,
    sleep: Callable[[float], None],
    rng: random.Random | None,
    *,
    label: str,
    classify: Classifier,
    timeout: dict[str, Any],
) -> int:
    """The input tokens of the Messages call ``params`` make, counted by ``client`` (an
    ``anthropic.Anthropic``); ``ProviderError`` once ``retry`` gives up, its ``label`` naming the
    endpoint. A 200 that carries no count is a ``MalformedReply`` (retried, bounded): a count
    that is not there must never size a call."""
    kwargs = {key: params[key] for key in COUNTED if key in params}

    def count() -> int:
        reply = parsed_or_page(client.messages.with_raw_response.count_tokens(**kwargs, **timeout))
        tokens = getattr(reply, "input_tokens", None)
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise MalformedReply(f"a count of {type(reply).__name__} without input_tokens", whole=True)
        return tokens

    counted, _ = call_with_retries(count, retry, sleep, rng=rng, label=f"{label} count_tokens", classify=classify)
    return counted
