"""AnthropicProvider / BedrockProvider through the real SDK against a local fake Messages API.

Nothing in the SDK is patched: the providers open real sockets to ``FakeMessagesAPI``. Only
``sleep`` (and the jitter ``rng``) are injected, so retries are proven without waiting.
"""

from __future__ import annotations

import dataclasses
import random
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.core.errors import ProviderError
from agentq.core.models import Usage
from agentq.core.providers.anthropic_provider import AnthropicProvider, BedrockProvider
from agentq.core.providers.base import LLMRequest, RetryNotice, reporting_retries
from agentq.core.providers.retry import RetryPolicy, backoff_delay, call_with_retries, retry_after_seconds

from tests.fake_messages_api import (
    FakeMessagesAPI,
    error_in_stream,
    error_reply,
    invalid_request,
    malformed_json,
    overloaded,
    rate_limited,
    text_reply,
    tool_use_reply,
    usage_dict,
    wrong_shape,
)

MODEL = "claude-sonnet-4-6"
BEDROCK_MODEL = "anthropic.claude-sonnet-4-6-v1:0"
API_KEY = "sk-ant-test-key"

WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


class RecordingSleep:
    """Stands in for ``time.sleep``: remembers each requested delay and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as server:
        yield server


@pytest.fixture
def sleep() -> RecordingSleep:
    return RecordingSleep()


def anthropic_provider(
    base_url: str, sleep: RecordingSleep, retry: RetryPolicy | None = None, **kwargs: Any
) -> AnthropicProvider:
    return AnthropicProvider(api_key=API_KEY, base_url=base_url, retry=retry, sleep=sleep, **kwargs)


def weather_request(model: str = MODEL) -> LLMRequest:
    return LLMRequest(
        model=model,
        system="You are a terse weather bot.",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=256,
    )


def follow_up(first: LLMRequest, assistant_content: list[dict[str, Any]], tool_use_id: str) -> LLMRequest:
    return first.model_copy(
        update={
            "messages": [
                *first.messages,
                {"role": "assistant", "content": assistant_content},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": tool_use_id, "content": "18C, sunny"}],
                },
            ]
        }
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- round trips ----------------------------------------------------------------------------


def test_tool_use_round_trip_sends_tools_and_messages_and_returns_blocks(
    api: FakeMessagesAPI, sleep: RecordingSleep, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_PROMPT_CACHE", "off")  # the request as the engine builds it (caching: its own tests)
    api.enqueue(
        tool_use_reply("get_weather", {"city": "Paris"}, tool_use_id="toolu_01A", text="Let me check."),
        text_reply("It is 18C and sunny in Paris."),
    )
    provider = anthropic_provider(api.base_url, sleep)
    first = weather_request()

    turn1 = provider.complete(first)

    assert turn1.stop_reason == "tool_use"
    assert turn1.content == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"city": "Paris"}},
    ]
    assert turn1.model == MODEL
    assert turn1.attempts == 1
    sent = api.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.body == {
        "stream": True,  # every call: its first event tells the input billed (ARCHITECTURE 4)
        "model": MODEL,
        "max_tokens": 256,
        "system": "You are a terse weather bot.",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
    }
    assert "anthropic-version" in sent.headers
    assert API_KEY in sent.headers.get("x-api-key", "") + sent.headers.get("authorization", "")

    turn2 = provider.complete(follow_up(first, turn1.content, "toolu_01A"))

    assert turn2.stop_reason == "end_turn"
    assert turn2.content == [{"type": "text", "text": "It is 18C and sunny in Paris."}]
    second = api.requests[1].body
    assert second["messages"][1] == {"role": "assistant", "content": turn1.content}
    assert second["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_01A",
        "content": "18C, sunny",
    }
    assert len(api.requests) == 2 and not api.unexpected and sleep.delays == []


def test_system_and_tools_are_omitted_from_the_wire_when_unset(api: FakeMessagesAPI, sleep: RecordingSleep) -> None:
    api.enqueue(text_reply("hi"))
    provider = anthropic_provider(api.base_url, sleep)

    provider.complete(LLMRequest(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=16))

    assert set(api.requests[0].body) == {"model", "max_tokens", "messages", "stream"}


def test_usage_is_recorded_exactly_as_the_server_reported_it_including_cache_tokens(
    api: FakeMessagesAPI, sleep: RecordingSleep
) -> None:
    api.enqueue(
        text_reply(
            "cached",
            usage=usage_dict(
                input_tokens=1234, output_tokens=567, cache_creation_input_tokens=89, cache_read_input_tokens=4321
            ),
        ),
        text_reply("uncached", usage=usage_dict(input_tokens=7, output_tokens=3)),  # cache fields null
    )
    provider = anthropic_provider(api.base_url, sleep)

    cached = provider.complete(weather_request())
    uncached = provider.complete(weather_request())

    assert cached.usage == Usage(
        input_tokens=1234, output_tokens=567, cache_creation_input_tokens=89, cache_read_input_tokens=4321
    )
    assert uncached.usage == Usage(input_tokens=7, output_tokens=3)


# --- retries --------------------------------------------------------------------------------


def test_rate_limit_429_is_retried_after_the_servers_retry_after_delay(
    api: FakeMessagesAPI, sleep: RecordingSleep
) -> None:
    api.enqueue(rate_limited(retry_after=1), text_reply("finally"))
    provider = anthropic_provider(api.base_url, sleep)

    response = provider.complete(weather_request())

    assert response.content == [{"type": "text", "text": "finally"}]
    assert response.attempts == 2
    assert sleep.delays == [1.0]
    assert len(api.requests) == 2


def test_retry_after_ms_is_preferred_and_any_hint_is_capped_at_max_delay(
    api: FakeMessagesAPI, sleep: RecordingSleep
) -> None:
    api.enqueue(
        rate_limited(retry_after=1, retry_after_ms=250),
        rate_limited(retry_after=3600),
        text_reply("ok"),
    )
    provider = anthropic_provider(api.base_url, sleep, RetryPolicy(max_delay=7))

    assert provider.complete(weather_request()).attempts == 3
    assert sleep.delays == [0.25, 7.0]


def test_server_errors_5xx_are_retried_and_the_attempts_are_counted(
    api: FakeMessagesAPI, sleep: RecordingSleep
) -> None:
    api.enqueue(
        error_reply(500, "api_error", "Internal server error"),
        error_reply(503, "api_error", "Service unavailable"),
        overloaded(),
        text_reply("recovered"),
    )
    provider = anthropic_provider(api.base_url, sleep)

    response = provider.complete(weather_request())

    assert response.attempts == 4
    assert len(sleep.delays) == 3
    assert len(api.requests) == 4


def test_burst_of_529s_longer_than_max_attempts_ends_in_retryable_provider_error(
    api: FakeMessagesAPI, sleep: RecordingSleep
) -> None:
    policy = RetryPolicy(max_attempts=5)
    api.enqueue(*(overloaded() for _ in range(policy.max_attempts + 3)))
    provider = anthropic_provider(api.base_url, sleep, policy)

    with pytest.raises(ProviderError) as caught:
        provider.complete(weather_request())

    err = caught.value
    assert err.retryable is True
    assert err.status_code == 529
    assert err.attempts == policy.max_attempts
    assert str(err) == "anthropic overloaded (529) after 5 attempts: Overloaded"
    assert err.code == "overloaded"
    # Exactly max_attempts on the wire also proves the SDK's own retry loop is off.
    assert len(api.requests) == policy.max_attempts
    assert api.pending == 3
    assert len(sleep.delays) == policy.max_attempts - 1


@pytest.mark.parametrize(
    ("status", "error_type", "code"),
    [
        (400, "invalid_request_error", "invalid_request"),
        (401, "authentication_error", "invalid_api_key"),
        (403, "permission_error", "permission_denied"),
        (404, "not_found_error", "model_not_found"),
        (413, "request_too_large", "request_too_large"),
        (422, "invalid_request_error", "provider_rejected"),
    ],
)
def test_non_retryable_status_fails_at_once_with_one_request_and_a_precise_code(
    api: FakeMessagesAPI, sleep: RecordingSleep, status: int, error_type: str, code: str
) -> None:
    api.enqueue(error_reply(status, error_type, "nope"), text_reply("never reached"))
    provider = anthropic_provider(api.base_url, sleep)

    with pytest.raises(ProviderError) as caught:
        provider.complete(weather_request())

    assert caught.value.retryable is False
    assert caught.value.status_code == status
    assert caught.value.code == code
    assert caught.value.attempts == 1
    assert len(api.requests) == 1
    assert sleep.delays == []


@pytest.mark.parametrize(
    ("error_type", "status", "code"),
    [
        ("overloaded_error", 529, "overloaded"),
        ("rate_limit_error", 429, "rate_limited"),
        ("api_error", 500, "provider_server_error"),
        ("an_error_of_a_newer_api", 500, "provider_server_error"),
    ],
)
def test_an_error_event_inside_a_stream_is_retried_as_the_status_its_type_names(
    api: FakeMessagesAPI, sleep: RecordingSleep, error_type: str, status: int, code: str
) -> None:
    """Anthropic reports an overload that comes once a stream began as an ``error`` event inside
    the 200, which the SDK raises with the stream's status (200): it was taken for a request the
    API refused, and failed the task for good, with no retry and no fallback."""
    api.enqueue(error_in_stream(error_type, "Overloaded"), text_reply("recovered"))
    assert anthropic_provider(api.base_url, sleep).complete(weather_request()).attempts == 2
    assert all(r.body.get("stream") is True for r in api.requests) and len(sleep.delays) == 1

    api.enqueue(*(error_in_stream(error_type, "Overloaded") for _ in range(2)))
    with pytest.raises(ProviderError) as caught:
        anthropic_provider(api.base_url, sleep, RetryPolicy(max_attempts=2)).complete(weather_request())
    failed = caught.value
    assert (failed.retryable, failed.status_code, failed.code) == (True, status, code), failed
    assert failed.maybe_billed  # its stream had begun: the input it told may be billed


def test_a_request_refused_inside_a_stream_fails_at_once_as_possibly_billed(
    api: FakeMessagesAPI, sleep: RecordingSleep
) -> None:
    """The same refusal as an HTTP 400 is known unbilled (no reply began); inside a stream that
    began, it may have been billed, so the task's hold for it must stay counted."""
    api.enqueue(error_in_stream("invalid_request_error", "bad"), invalid_request("bad"))
    provider = anthropic_provider(api.base_url, sleep)
    outcomes = []
    for _ in range(2):
        with pytest.raises(ProviderError) as caught:
            provider.complete(weather_request())
        outcomes.append((caught.value.code, caught.value.retryable, caught.value.attempts, caught.value.maybe_billed))
    assert outcomes == [("invalid_request", False, 1, True), ("invalid_request", False, 1, False)]
    assert sleep.delays == []


def test_400_invalid_request_error_message_names_the_cause(api: FakeMessagesAPI, sleep: RecordingSleep) -> None:
    api.enqueue(invalid_request("max_tokens: must be positive"))
    provider = anthropic_provider(api.base_url, sleep)

    with pytest.raises(ProviderError) as caught:
        provider.complete(weather_request())

    assert str(caught.value) == (
        "anthropic rejected the request (400 invalid_request_error): max_tokens: must be positive"
    )
    assert len(api.requests) == 1


def test_connection_refused_is_retried_then_fails_as_retryable_provider_error(sleep: RecordingSleep) -> None:
    policy = RetryPolicy(max_attempts=3)
    provider = anthropic_provider(f"http://127.0.0.1:{free_port()}", sleep, policy)

    with pytest.raises(ProviderError) as caught:
        provider.complete(weather_request())

    err = caught.value
    assert err.retryable is True
    assert err.status_code is None
    assert err.attempts == 3
    assert str(err).startswith("anthropic connection failed after 3 attempts: ")
    assert len(sleep.delays) == 2


# --- replies that are not a Message, missing credentials -------------------------------------


def test_a_reply_that_is_not_json_is_retried_and_the_next_good_one_is_used(
    api: FakeMessagesAPI, sleep: RecordingSleep
) -> None:
    api.enqueue(malformed_json(), wrong_shape(), text_reply("whole"))
    provider = anthropic_provider(api.base_url, sleep)

    response = provider.complete(weather_request())

    assert response.content == [{"type": "text", "text": "whole"}] and response.attempts == 3
    assert len(sleep.delays) == 2


@pytest.mark.parametrize(
    ("cut_at", "streamed"),
    [(0.0, False), (0.0, True), (0.5, False), (0.5, True), (0.1, True), (0.9, False)],
    ids=["stall-then-reset", "stall-then-reset-streamed", "half-a-body", "half-a-stream", "a-stream's-start",
         "most-of-a-body"],
)  # fmt: skip
def test_a_reply_reset_before_any_byte_or_cut_midway_is_a_lost_connection_and_the_next_reply_is_used(
    monkeypatch: pytest.MonkeyPatch, sleep: RecordingSleep, cut_at: float, streamed: bool
) -> None:
    """The chaos run's cuts (bench/chaos.py): whatever part of a reply, plain or streamed, came
    before the reset, the client sees a lost connection (never a traceback, never a reply), and
    the server reports a reply it cut after the headers as billed (``on_cut``), one reset before
    any byte as not."""
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "100" if streamed else "8192")
    cut: list[dict[str, Any]] = []
    usage = usage_dict(input_tokens=50, output_tokens=9)
    with FakeMessagesAPI(on_cut=lambda _request, used: cut.append(used)) as api:
        api.enqueue(
            dataclasses.replace(text_reply("cut short " * 40, usage=usage), cut_at=cut_at, delay_seconds=0.1),
            text_reply("whole"),
        )
        response = anthropic_provider(api.base_url, sleep).complete(weather_request())

    assert response.content == [{"type": "text", "text": "whole"}] and response.attempts == 2
    assert cut == ([usage] if cut_at > 0 else [])


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (malformed_json(), "not JSON"),
        (wrong_shape(), "content: Field required"),
        (wrong_shape([1, 2]), "a JSON list, not an object"),
        (
            wrong_shape({**text_reply("x").body, "usage": {"input_tokens": "many"}}),  # type: ignore[dict-item]
            "usage.input_tokens",
        ),
        (
            wrong_shape({**text_reply("x").body, "content": [{"type": "tool_use", "id": "t", "name": "n"}]}),  # type: ignore[dict-item]
            "a tool_use block needs input (dict)",
        ),
    ],
)
def test_replies_that_are_never_a_message_fail_after_the_attempts_and_are_not_handed_to_the_queue(
    api: FakeMessagesAPI, sleep: RecordingSleep, monkeypatch: pytest.MonkeyPatch, reply: Any, why: str
) -> None:
    """A whole reply (not streamed) is checked field by field; a stream's are below."""
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "8192")
    policy = RetryPolicy(max_attempts=3)
    api.enqueue(*[reply] * policy.max_attempts)
    provider = anthropic_provider(api.base_url, sleep, policy)

    with pytest.raises(ProviderError) as caught:
        provider.complete(weather_request())

    err = caught.value
    assert (err.code, err.retryable, err.attempts) == ("malformed_response", False, 3)
    assert why in err.message and "after 3 attempts" in err.message
    assert len(api.requests) == 3 and api.pending == 0


@pytest.mark.parametrize(
    "reply", [malformed_json(), wrong_shape(), wrong_shape([1, 2])], ids=["cut JSON", "object", "list"]
)
def test_a_200_that_is_no_event_stream_where_one_was_asked_is_a_malformed_reply_naming_what_came(
    api: FakeMessagesAPI, sleep: RecordingSleep, reply: Any
) -> None:
    """A gateway that answers a streamed call with a JSON page: retried, then a malformed
    reply whose message names the content type that came instead, never a bare SDK assert."""
    policy = RetryPolicy(max_attempts=2)
    api.enqueue(*[reply] * policy.max_attempts)
    provider = anthropic_provider(api.base_url, sleep, policy)

    with pytest.raises(ProviderError) as caught:
        provider.complete(weather_request())

    err = caught.value
    assert (err.code, err.retryable, err.attempts) == ("malformed_response", False, 2)
    assert "a 200 of application/json that carried no message, where an event stream was asked" in err.message
    assert all(r.body.get("stream") is True for r in api.requests) and len(api.requests) == 2


def test_without_an_api_key_the_provider_fails_before_any_call(
    api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)

    with pytest.raises(ProviderError) as caught:
        AnthropicProvider(base_url=api.base_url)

    assert (caught.value.code, caught.value.retryable) == ("missing_api_key", False)
    assert "ANTHROPIC_API_KEY" in caught.value.message and api.requests == []


def test_each_retry_is_reported_with_its_attempt_error_and_wait(api: FakeMessagesAPI, sleep: RecordingSleep) -> None:
    api.enqueue(overloaded(), rate_limited(retry_after=2), malformed_json(), text_reply("there"))
    provider = anthropic_provider(api.base_url, sleep, RetryPolicy(max_attempts=4, jitter="none", base_delay=0.5))
    notices: list[RetryNotice] = []

    with reporting_retries(notices.append):
        assert provider.complete(weather_request()).attempts == 4

    assert [(n.attempt, n.max_attempts, n.code, n.status_code, n.delay) for n in notices] == [
        (1, 4, "overloaded", 529, 0.5),
        (2, 4, "rate_limited", 429, 2.0),
        (3, 4, "malformed_response", None, 2.0),
    ]
    assert notices[0].message == "anthropic overloaded (529): Overloaded"
    assert sleep.delays == [0.5, 2.0, 2.0]
    api.enqueue(overloaded(), text_reply("again"))
    provider.complete(weather_request())  # outside the block: nothing reported
    assert len(notices) == 3


def test_bedrock_without_aws_credentials_fails_with_a_precise_error(
    api: FakeMessagesAPI, sleep: RecordingSleep, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_BEARER_TOKEN_BEDROCK", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # a region of its own: the SDK caches one boto3 session per region and credentials
    provider = BedrockProvider(aws_region="ap-southeast-4", base_url=api.base_url, sleep=sleep)

    with pytest.raises(ProviderError) as caught:
        provider.complete(weather_request(BEDROCK_MODEL))

    assert (caught.value.code, caught.value.retryable) == ("missing_aws_credentials", False)
    assert api.requests == [] and sleep.delays == []


# --- Bedrock --------------------------------------------------------------------------------


def test_bedrock_tool_use_round_trip_goes_through_model_invoke(
    api: FakeMessagesAPI, sleep: RecordingSleep, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_BEARER_TOKEN_BEDROCK", raising=False)  # would bypass SigV4
    monkeypatch.setenv("AGENTQ_PROMPT_CACHE", "off")  # the request as the engine builds it
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    api.enqueue(
        tool_use_reply("get_weather", {"city": "Paris"}, tool_use_id="toolu_bdrk_01", model=BEDROCK_MODEL),
        text_reply("18C and sunny.", model=BEDROCK_MODEL),
    )
    provider = BedrockProvider(aws_region="us-east-1", base_url=api.base_url, sleep=sleep)
    assert provider.name == "bedrock"
    first = weather_request(BEDROCK_MODEL)

    turn1 = provider.complete(first)

    assert turn1.stop_reason == "tool_use"
    assert turn1.content == [
        {"type": "tool_use", "id": "toolu_bdrk_01", "name": "get_weather", "input": {"city": "Paris"}}
    ]
    sent = api.requests[0]
    assert sent.path == f"/model/{BEDROCK_MODEL}/invoke"
    assert sent.model == BEDROCK_MODEL
    assert "model" not in sent.body
    assert "anthropic_version" in sent.body
    assert sent.body["tools"] == [WEATHER_TOOL]
    assert sent.body["messages"] == first.messages
    assert sent.headers["authorization"].startswith("AWS4-HMAC-SHA256 ")
    assert "/us-east-1/bedrock/aws4_request" in sent.headers["authorization"]

    turn2 = provider.complete(follow_up(first, turn1.content, "toolu_bdrk_01"))

    assert turn2.stop_reason == "end_turn"
    assert turn2.content == [{"type": "text", "text": "18C and sunny."}]
    assert turn2.model == BEDROCK_MODEL
    assert api.requests[1].body["messages"][2]["content"][0]["tool_use_id"] == "toolu_bdrk_01"


# --- backoff --------------------------------------------------------------------------------


def test_backoff_delays_are_full_jitter_within_the_exponential_ceiling(
    api: FakeMessagesAPI, sleep: RecordingSleep
) -> None:
    policy = RetryPolicy(max_attempts=7, base_delay=0.5, max_delay=4)
    api.enqueue(*(overloaded() for _ in range(policy.max_attempts)))
    provider = anthropic_provider(api.base_url, sleep, policy, rng=random.Random(20240601))

    with pytest.raises(ProviderError):
        provider.complete(weather_request())

    assert len(sleep.delays) == policy.max_attempts - 1
    for n, delay in enumerate(sleep.delays):
        assert 0 <= delay <= min(policy.max_delay, policy.base_delay * 2**n)
    assert len(set(sleep.delays)) == len(sleep.delays)  # not a constant wait


def test_full_jitter_spreads_over_the_whole_window() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=30)
    rng = random.Random(7)

    samples = [backoff_delay(policy, 3, rng) for _ in range(2000)]  # window [0, 4]

    assert all(0 <= s <= 4.0 for s in samples)
    assert min(samples) < 0.2 and max(samples) > 3.8
    assert backoff_delay(policy, 50, rng) <= policy.max_delay
    assert backoff_delay(RetryPolicy(jitter="none"), 2) == 2.0


def test_call_with_retries_returns_result_and_attempt_count_without_sleeping_on_success() -> None:
    sleep = RecordingSleep()

    assert call_with_retries(lambda: "ok", RetryPolicy(), sleep) == ("ok", 1)
    assert sleep.delays == []


def test_retry_after_parses_seconds_millis_and_http_dates() -> None:
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after": "1.5", "retry-after-ms": "300"}) == 0.3
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=lambda: 1445412480.0) == 10.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ('{"max_attempt": 3}', "max_attempt: Extra inputs are not permitted"),
        ('{"max_attempts": 0}', "max_attempts: Input should be greater than or equal to 1"),
        ('{"base_delay": 5, "max_delay": 1}', "base_delay must not exceed max_delay"),
        ("five", "not JSON"),
        ("[5]", "Input should be a valid dictionary"),
    ],
)
def test_a_bad_provider_retry_setting_is_refused_at_startup_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str, said: str
) -> None:
    """Read when a provider is built: left to then, every task failed at its first model call as
    ``processing_failed`` with pydantic's ValidationError, and no worker said why at startup."""
    from agentq.control.defaults import ConfigurationError
    from agentq.runtime import Settings, engine_config

    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", raw)
    with pytest.raises(ConfigurationError, match="AGENTQ_PROVIDER_RETRY") as caught:
        engine_config(Settings.for_prefix("agentq-test", None, region="us-east-1"))
    assert said in str(caught.value) and caught.value.field == "AGENTQ_PROVIDER_RETRY"
