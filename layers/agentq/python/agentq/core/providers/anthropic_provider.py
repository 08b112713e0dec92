"""Providers backed by the real Anthropic SDK: the Anthropic API and Amazon Bedrock.

Both go through the same Messages call, so the engine sees one behaviour whichever endpoint a
task names; only the client construction (API key vs SigV4) differs. Every call to the
Anthropic API is streamed unless ``AGENTQ_STREAM_ABOVE_TOKENS`` says otherwise: the stream's
first event says what input is billed and each ``message_delta`` the output so far, which the
heartbeat publishes, so a worker killed mid-call leaves only the output since its last
heartbeat unknown (``base.stream_above``). The assembled Message is what ``create`` would
have returned.

A reply is checked before anything reads it (``anthropic_reply.to_llm_response``). Missing
credentials are found before the first call, as errors that no retry can fix.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable
from typing import Any

import anthropic

from agentq.core.errors import ProviderError
from agentq.core.models import Usage
from agentq.core.providers import caching
from agentq.core.providers.anthropic_count import count_input
from agentq.core.providers.anthropic_reply import to_llm_response
from agentq.core.providers.base import (
    DEFAULT_MAX_CALL_SECONDS,
    STREAM_ABOVE_DEFAULT,
    STREAM_EVERY_CALL,
    LLMRequest,
    LLMResponse,
    attempt_timeout,
    check_cut,
    checked_base_url,
    pause,
    report_text,
    report_usage,
    stream_above,
)
from agentq.core.providers.caching import CacheTtl
from agentq.core.providers.keys import keep_out_of_text
from agentq.core.providers.pages import parsed_or_page, streamed_page
from agentq.core.providers.retry import (
    MALFORMED,
    CallFailure,
    MalformedReply,
    RetryPolicy,
    call_with_retries,
    error_status_answered,
    no_reply_began,
)
from agentq.core.providers.shared_clients import anthropic_bedrock_client, anthropic_client

NATIVE_COMPACTION_BETA = "compact-2026-01-12"

BASE_URL_VARIABLE = "ANTHROPIC_BASE_URL"
BEDROCK_BASE_URL_VARIABLE = "AGENTQ_BEDROCK_BASE_URL"  # the factory's (``providers.default_provider_factory``)
SDK_BEDROCK_BASE_URL_VARIABLE = "ANTHROPIC_BEDROCK_BASE_URL"  # the SDK's own, read when no base URL is given

DEFAULT_TIMEOUT_SECONDS = DEFAULT_MAX_CALL_SECONDS  # AGENTQ_MAX_CALL_SECONDS overrides it (providers/base.py)

log = logging.getLogger("agentq.providers")


class _MessagesProvider:
    """Shared call path; subclasses only decide which SDK client to build."""

    name: str = ""
    # Calls allowed more output than this are streamed when AGENTQ_STREAM_ABOVE_TOKENS is unset.
    stream_above_default: int = STREAM_EVERY_CALL

    def __init__(
        self,
        client: Any,
        retry: RetryPolicy,
        sleep: Callable[[float], None],
        rng: random.Random | None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        # Even an injected client must not retry on its own: the attempts we count and the
        # delays we bound would otherwise be multiplied by the SDK's hidden loop.
        if getattr(client, "max_retries", 0) != 0:
            client = client.with_options(max_retries=0)
        # The key or token it sends (Anthropic's, or a Bedrock API key): an echo of it is redacted.
        keep_out_of_text(getattr(client, "api_key", None), getattr(client, "auth_token", None))
        self._client = client
        self.retry = retry
        self._sleep = sleep
        self._rng = rng
        self._timeout = timeout

    def complete(self, request: LLMRequest) -> LLMResponse:
        """One assistant turn; raises ``ProviderError`` once the retry policy gives up."""
        kwargs = self._params(request)
        endpoint = self._client.beta.messages if "betas" in kwargs else self._client.messages
        streamed = self.streams(request)

        def send(**kw: Any) -> Any:
            if streamed:
                return self._streamed(endpoint, **kw)
            return parsed_or_page(endpoint.with_raw_response.create(**kw))

        response, attempts = call_with_retries(
            lambda: to_llm_response(send(**kwargs, **self._cut_timeout()), 1),
            self.retry,
            self._sleep,
            rng=self._rng,
            label=self.name,
            classify=anthropic_failure,
        )
        return response.model_copy(update={"attempts": attempts, "streamed": streamed})

    def streams(self, request: LLMRequest) -> bool:
        return request.max_tokens > stream_above(self.stream_above_default)

    @property
    def endpoint(self) -> str | None:
        base = getattr(self._client, "base_url", None)
        return str(base) if base is not None else None

    def _params(self, request: LLMRequest) -> dict[str, Any]:
        """The Messages API parameters of ``request`` (a call's, or a batch request's)."""
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
        if request.thinking_budget:
            kwargs["thinking"] = {"type": "enabled", "budget_tokens": request.thinking_budget}
        if request.effort:
            kwargs["output_config"] = {"effort": request.effort}
        if caching.enabled():
            kwargs = caching.cached_request(kwargs, self._cache_ttl(request))
        if request.compact_at:
            kwargs["betas"] = [NATIVE_COMPACTION_BETA]
            kwargs["context_management"] = {
                "edits": [
                    {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": request.compact_at}}
                ]
            }
        return kwargs

    def _cache_ttl(self, request: LLMRequest) -> CacheTtl | None:
        return request.cache_ttl

    def _cut_timeout(self) -> dict[str, Any]:
        """An attempt under a task's deadline (``base.cutting_at``) times out at it: httpx then
        closes the connection, so the call is cut, not left running."""
        timeout = attempt_timeout(self._timeout)
        return {} if timeout is None else {"timeout": timeout}

    def _streamed(self, endpoint: Any, **kwargs: Any) -> Any:
        """A long output streamed (server-sent events) and assembled by the SDK: the connection
        carries data all along, so no proxy or idle timeout cuts a call that writes for minutes.
        The Message it returns is what ``create`` would have returned."""
        with endpoint.stream(**kwargs) as stream:
            page = streamed_page(stream.response, anthropic.APITimeoutError, anthropic.APIConnectionError)
            if page is not None:  # a gateway's page where the stream should be
                raise page
            text = ""
            billed = Usage(input_tokens=0, output_tokens=0)
            for event in stream:
                check_cut()  # the task's deadline: leaving the block closes the stream
                if event.type == "text":
                    text += event.text
                    report_text(text)
                elif event.type == "message_start":  # the input is billed from here on, whatever follows
                    started = event.message.usage
                    billed = Usage(
                        input_tokens=started.input_tokens, output_tokens=started.output_tokens or 0,
                        cache_creation_input_tokens=started.cache_creation_input_tokens or 0,
                        cache_read_input_tokens=started.cache_read_input_tokens or 0,
                    )  # fmt: skip
                    report_usage(billed)
                elif event.type == "message_delta" and event.usage is not None:  # its output so far
                    billed = billed.model_copy(update={"output_tokens": event.usage.output_tokens or 0})
                    report_usage(billed)
            try:
                return stream.get_final_message()
            except AssertionError as exc:  # the SDK asserts it saw a message_start: a 200 that was no stream
                kind = stream.response.headers.get("content-type") or "no content type"
                raise MalformedReply(
                    f"a 200 of {kind} that carried no message, where an event stream was asked"
                ) from exc


# The HTTP status the API documents for each of its error types: what an error event inside a
# 200's stream (``event: error``) is taken for, since its response says 200. An overload after
# the stream began comes this way (every Anthropic call streams), and must be retried, and fall
# over to a task's fallback, as the 529 it is; an unknown type is the server's error (500).
STREAM_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


def anthropic_failure(exc: Exception) -> CallFailure | None:
    """The Anthropic SDK's exceptions (Anthropic API and Bedrock alike); None: not the SDK's.

    An error event inside a stream reaches us as an ``APIStatusError`` whose status is the
    stream's 200: it is coded by its error type (``STREAM_ERROR_STATUS``), and may have been
    billed (the stream's ``message_start`` had told the input), so never ``unbilled``."""
    if isinstance(exc, anthropic.APIStatusError):
        kind = _error_field(exc, "type")
        status = exc.status_code
        if status < 400:
            status = STREAM_ERROR_STATUS.get(kind or "", 500)
        return CallFailure(
            "status", status, kind, _detail(exc), exc.response.headers,
            unbilled=error_status_answered(exc.response.status_code),
        )  # fmt: skip
    if isinstance(exc, anthropic.APITimeoutError):
        return CallFailure("timeout", detail=_detail(exc), unbilled=no_reply_began(exc))
    if isinstance(exc, anthropic.APIConnectionError):
        return CallFailure("connection", detail=_detail(exc), unbilled=no_reply_began(exc))
    if isinstance(exc, anthropic.APIError):
        return CallFailure("malformed", detail=str(exc)[:200] or type(exc).__name__)
    return None


def _detail(exc: anthropic.APIError) -> str:
    return _error_field(exc, "message") or exc.message or type(exc).__name__


def _error_field(exc: anthropic.APIError, key: str) -> str | None:
    # Read from the body, not SDK attributes (``api_message``/``type``), which older SDKs lack.
    # Anthropic nests the fields under "error"; Bedrock puts "message" at the top level.
    body = exc.body
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    value = error.get(key) if isinstance(error, dict) else body.get(key)
    return value if isinstance(value, str) else None


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
        sleep: Callable[[float], None] = pause,
        rng: random.Random | None = None,
    ) -> None:
        if client is None:
            if not (api_key or os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
                raise ProviderError(
                    "no Anthropic API key: set ANTHROPIC_API_KEY where the workers run (locally: in the shell that "
                    "starts `agentq dev`, not the one that submits; in AWS, the secret named by "
                    "AGENTQ_ANTHROPIC_API_KEY_SECRET)",
                    retryable=False,
                    code="missing_api_key",
                )
            given = base_url if base_url is not None else os.environ.get(BASE_URL_VARIABLE)
            checked_base_url(given, BASE_URL_VARIABLE, self.name)
            client = anthropic_client(api_key, base_url, timeout)
        super().__init__(client, retry or RetryPolicy.from_env(), sleep, rng, timeout)

    def count_input_tokens(self, request: LLMRequest) -> int:
        """``base.InputCounter``: the input a call of ``request`` is billed, counted free (``anthropic_count``)."""
        return count_input(self._client, self._params(request), self.retry, self._sleep, self._rng, label=self.name,
                           classify=anthropic_failure, timeout=self._cut_timeout())  # fmt: skip

    # Economy mode (``core.providers.base.BatchProvider``): one request per batch, so a task's
    # turn waits for nothing but itself; the custom_id ties the result to the task's step.

    def submit_batch(self, request: LLMRequest, custom_id: str) -> str:
        params = self._params(request)
        for beta in ("betas", "context_management"):  # a batch takes Messages parameters only
            params.pop(beta, None)
        batch, _ = call_with_retries(
            lambda: self._client.messages.batches.create(requests=[{"custom_id": custom_id, "params": params}]),
            self.retry, self._sleep, rng=self._rng, label=self.name, classify=anthropic_failure,
        )  # fmt: skip
        return str(batch.id)

    def batch_result(self, batch_id: str, custom_id: str) -> LLMResponse | None:
        """The batch's answer for ``custom_id``; None while it runs, or while it cannot be read
        (the API failing after its retries, as in an outage: the batch may have ended and been
        billed, so it is looked at again later, never given up on and sent anew)."""
        try:
            batch, _ = call_with_retries(
                lambda: self._client.messages.batches.retrieve(batch_id),
                self.retry, self._sleep, rng=self._rng, label=self.name, classify=anthropic_failure,
            )  # fmt: skip
            if batch.processing_status != "ended":
                return None
            items, _ = call_with_retries(
                lambda: list(self._client.messages.batches.results(batch_id)),
                self.retry, self._sleep, rng=self._rng, label=self.name, classify=anthropic_failure,
            )  # fmt: skip
        except ProviderError as exc:
            if not exc.retryable:  # refused for good (gone, forbidden): what became of the batch is unknown
                raise ProviderError(
                    f"batch {batch_id} could not be read: {exc.message}", retryable=False, status_code=exc.status_code,
                    attempts=exc.attempts, code="batch_not_found" if exc.status_code == 404 else exc.code,
                    maybe_billed=True,
                ) from exc  # fmt: skip
            log.warning("batch %s could not be read (%s): looked at again later", batch_id, exc.code)
            return None
        for item in items:
            if item.custom_id != custom_id:
                continue
            result = item.result
            if result.type == "succeeded":
                try:
                    return to_llm_response(result.message, 1)
                except MalformedReply as exc:  # the batch ran and was billed: its answer is what is wrong
                    raise ProviderError(
                        f"batch {batch_id}: its answer is not a reply: {exc}"[:500], retryable=False, code=MALFORMED,
                        maybe_billed=True,
                    ) from exc  # fmt: skip
            if result.type == "errored":
                error = getattr(result.error, "error", None)
                kind = str(getattr(error, "type", "api_error"))
                raise ProviderError(
                    f"batch {batch_id}: {getattr(error, 'message', 'the request errored')}",
                    retryable=kind in ("api_error", "overloaded_error", "rate_limit_error"),
                    code=kind,
                )
            raise ProviderError(
                f"batch {batch_id}: the request {result.type}", retryable=True, code=f"batch_{result.type}"
            )
        raise ProviderError(f"batch {batch_id} holds no result for {custom_id}", retryable=True, code="batch_missing",
                            maybe_billed=True)  # fmt: skip


class BedrockProvider(_MessagesProvider):
    """Claude on Amazon Bedrock, signed with the ambient AWS credentials (the Lambda role).

    Its stream (``invoke-with-response-stream``) comes as AWS event-stream frames, which no
    local server of the suite speaks yet: only long outputs are streamed, as before."""

    stream_above_default = STREAM_ABOVE_DEFAULT

    def _cache_ttl(self, request: LLMRequest) -> CacheTtl | None:
        return None  # Bedrock caches for five minutes and takes no ttl field

    name = "bedrock"

    def __init__(
        self,
        aws_region: str | None = None,
        base_url: str | None = None,
        retry: RetryPolicy | None = None,
        client: anthropic.AnthropicBedrock | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        sleep: Callable[[float], None] = pause,
        rng: random.Random | None = None,
    ) -> None:
        if client is None:
            # the factory's AGENTQ_BEDROCK_BASE_URL, else the SDK reads its own variable
            named = BEDROCK_BASE_URL_VARIABLE if base_url is not None else SDK_BEDROCK_BASE_URL_VARIABLE
            checked_base_url(base_url if base_url is not None else os.environ.get(named), named, self.name)
            client = anthropic_bedrock_client(aws_region, base_url, timeout)
        super().__init__(client, retry or RetryPolicy.from_env(), sleep, rng, timeout)

    def complete(self, request: LLMRequest) -> LLMResponse:
        try:
            return super().complete(request)
        except RuntimeError as exc:  # the SDK signs each request, and says so when it finds no credentials
            if "AWS credentials" not in str(exc):
                raise
            raise ProviderError(
                f"bedrock: {exc} (give the worker an IAM role, or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
                retryable=False,
                code="missing_aws_credentials",
            ) from None
