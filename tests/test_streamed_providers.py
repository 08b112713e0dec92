"""Long outputs streamed by the ``openai`` and ``bedrock-converse`` providers as by Anthropic's:
past ``AGENTQ_STREAM_ABOVE_TOKENS`` of output the call is a stream (Chat Completions with
``stream=True`` and the usage asked for; ConverseStream's event-stream frames), through the real
SDKs (openai; boto3, whose botocore decodes the frames) against the local servers; the text so
far reaches ``report_text`` (the task's live text), and the reply assembled from the stream is
the one a plain call gives: text, tool calls, reasoning, stop reason, usage."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.control.submit import parse_submission
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ProviderError
from agentq.core.models import LLMStep, TaskStatus
from agentq.core.providers import LLMRequest
from agentq.core.providers.base import reporting_text
from agentq.core.providers.bedrock_converse import BedrockConverseProvider
from agentq.core.providers.openai_provider import OpenAIProvider
from agentq.core.providers.retry import RetryPolicy
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_model_servers import (
    WEATHER_TOOL,
    FakeChatCompletions,
    FakeConverse,
    FakeReply,
    Sleeps,
    chat_completion,
    converse_reply,
    converse_stream_exception,
    point_boto3_at,
)
from tests.helpers import live_texts_while_it_runs

STORAGE = "memory"
LONG = 32_000  # max_tokens past the threshold below: streamed
TEXT = "First the catalogue. Then the price list. Finally: sunny, 21C."
NOVA = "us.amazon.nova-pro-v1:0"


@pytest.fixture(autouse=True)
def _threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "8192")


@pytest.fixture
def chat(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeChatCompletions]:
    with FakeChatCompletions() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.openai_base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        yield fake


@pytest.fixture
def converse(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeConverse]:
    with FakeConverse() as fake:
        point_boto3_at(fake, monkeypatch.setenv)
        yield fake


def request(model: str, max_tokens: int = LONG) -> LLMRequest:
    return LLMRequest(model=model, system="Be brief.", messages=[{"role": "user", "content": "Weather in Paris?"}],
                      tools=[WEATHER_TOOL], max_tokens=max_tokens)  # fmt: skip


def retry() -> RetryPolicy:
    return RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=1)


def heard(call: Any) -> tuple[Any, list[str]]:
    texts: list[str] = []
    with reporting_text(texts.append):
        return call(), texts


def test_a_long_chat_completion_is_streamed_and_assembled_into_the_reply_a_plain_call_gives(
    chat: FakeChatCompletions,
) -> None:
    reply = chat_completion(TEXT, [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Lyon"})],
                            prompt_tokens=900, completion_tokens=60, cached_tokens=700)  # fmt: skip
    chat.enqueue(reply, reply)
    openai = OpenAIProvider(retry=retry(), sleep=Sleeps())
    streamed, texts = heard(lambda: openai.complete(request("gpt-4.1-mini")))
    plain = openai.complete(request("gpt-4.1-mini", max_tokens=256))
    long_call, short_call = (r.body for r in chat.requests)
    assert long_call["stream"] is True and long_call["stream_options"] == {"include_usage": True}
    assert "stream" not in short_call
    # Tool calls by index, usage with the cache reads split out; only the telemetry's flag differs.
    assert streamed.model_dump(exclude={"streamed"}) == plain.model_dump(exclude={"streamed"})
    assert (streamed.streamed, plain.streamed) == (True, False)
    assert [b["input"] for b in streamed.content if b["type"] == "tool_use"] == [{"city": "Paris"}, {"city": "Lyon"}]
    assert streamed.usage.cache_read_input_tokens == 700 and streamed.stop_reason == "tool_use"
    assert len(texts) >= 3 and texts[-1] == TEXT and all(TEXT.startswith(t) for t in texts)  # the text so far


def test_a_chat_stream_that_ends_without_its_usage_is_retried_then_fails_as_malformed(
    chat: FakeChatCompletions,
) -> None:
    """A server that ignores stream_options.include_usage: no budget may be settled without usage."""
    no_usage = b'data: {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
    chat.enqueue(*[FakeReply(200, events=[no_usage], content_type="text/event-stream")] * 2)
    sleeps = Sleeps()
    with pytest.raises(ProviderError) as caught:
        OpenAIProvider(retry=retry(), sleep=sleeps).complete(request("gpt-4.1-mini"))
    assert caught.value.code == "malformed_response" and not caught.value.retryable, caught.value
    assert "usage" in str(caught.value) and len(sleeps) == 1


def _error_inside_a_chat_stream(error: dict[str, Any]) -> FakeReply:
    """A 200 stream that begins a reply, then carries the server's error (as OpenAI reports a
    failure once a stream began)."""
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4.1-mini",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}]}  # fmt: skip
    events = [f"data: {json.dumps(chunk)}\n\n".encode(), f"data: {json.dumps({'error': error})}\n\n".encode()]
    return FakeReply(200, events=events, content_type="text/event-stream")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ({"message": "The server had an error while processing your request.", "type": "server_error"},
         "provider_server_error"),
        ({"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}, "rate_limited"),
    ],
    ids=["server_error", "rate_limit_exceeded"],
)  # fmt: skip
def test_an_error_inside_a_chat_stream_is_retried_as_the_server_error_or_rate_limit_it_names(
    chat: FakeChatCompletions, error: dict[str, Any], code: str
) -> None:
    """Before, every error inside a stream was a malformed reply: failed for good once the
    attempts were spent, with no fallback asked, as if the server had answered garbage."""
    chat.enqueue(_error_inside_a_chat_stream(error), chat_completion("ok"))
    assert OpenAIProvider(retry=retry(), sleep=Sleeps()).complete(request("gpt-4.1-mini")).attempts == 2
    chat.enqueue(*(_error_inside_a_chat_stream(error) for _ in range(2)))
    with pytest.raises(ProviderError) as caught:
        OpenAIProvider(retry=retry(), sleep=Sleeps()).complete(request("gpt-4.1-mini"))
    failed = caught.value
    assert (failed.code, failed.retryable, failed.maybe_billed) == (code, True, True), failed
    assert error["message"] in failed.message


def test_a_long_converse_call_goes_through_converse_stream_and_is_assembled_into_the_reply_converse_gives(
    converse: FakeConverse,
) -> None:
    reply = converse_reply(TEXT, [("get_weather", {"city": "Paris"})], input_tokens=500, output_tokens=70,
                           cache_read=300, cache_write=40, reasoning=("Paris in June: warm.", "sig-1"))  # fmt: skip
    converse.enqueue(reply, reply)
    bedrock = BedrockConverseProvider(region="us-east-1", retry=retry(), sleep=Sleeps())
    streamed, texts = heard(lambda: bedrock.complete(request(NOVA)))
    plain = bedrock.complete(request(NOVA, max_tokens=256))
    assert [r.path.rsplit("/", 1)[-1] for r in converse.requests] == ["converse-stream", "converse"]
    assert [r.model for r in converse.requests] == [NOVA, NOVA]
    assert streamed.model_dump(exclude={"streamed"}) == plain.model_dump(exclude={"streamed"})
    assert (streamed.streamed, plain.streamed) == (True, False)
    assert streamed.content[0] == {"type": "thinking", "thinking": "Paris in June: warm.", "signature": "sig-1"}
    assert streamed.content[-1]["input"] == {"city": "Paris"} and streamed.stop_reason == "tool_use"
    assert streamed.usage.cache_read_input_tokens == 300 and streamed.usage.cache_creation_input_tokens == 40
    assert len(texts) >= 3 and texts[-1] == TEXT and all(TEXT.startswith(t) for t in texts)


def test_a_throttle_inside_a_converse_stream_is_retried_like_a_429(converse: FakeConverse) -> None:
    converse.enqueue(converse_stream_exception("throttlingException", "Too many tokens"), converse_reply("ok"))
    sleeps = Sleeps()
    result = BedrockConverseProvider(region="us-east-1", retry=retry(), sleep=sleeps).complete(request(NOVA))
    assert result.content == [{"type": "text", "text": "ok"}] and result.attempts == 2 and len(sleeps) == 1


@pytest.mark.parametrize("provider", ["openai", "bedrock-converse"])
def test_the_text_of_a_streamed_call_in_flight_rides_on_the_heartbeat_and_the_step_is_the_whole_reply(
    provider: str, chat: FakeChatCompletions, converse: FakeConverse, store: Storage, registry: ToolRegistry
) -> None:
    """What `agentq watch` and the event stream show as the model writes, as for Anthropic."""
    server, reply, model = (
        (chat, chat_completion(TEXT), "gpt-4.1-mini")
        if provider == "openai"
        else (converse, converse_reply(TEXT), NOVA)
    )
    server.enqueue(dataclasses.replace(reply, stream_pause_seconds=1.2))
    body = {"goal": "weather?", "provider": provider, "model": model, "constraints": {"max_output_tokens": LONG}}
    task = store.tasks.create(parse_submission(body), tenant="t")
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=3, heartbeat_seconds=0.3))
    seen = live_texts_while_it_runs(store, engine, task.task_id)
    assert any(TEXT.startswith(s) and s != TEXT for s in seen), seen  # a part, while it was being written
    final = store.tasks.get(task.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == TEXT and final.live_text is None
    [step] = store.steps.load(task.task_id)
    assert isinstance(step.body, LLMStep) and step.body.content == [{"type": "text", "text": TEXT}]


def test_an_anthropic_stream_whose_200_carries_no_message_is_retried_then_fails_as_malformed() -> None:
    """Found by the zombies chaos run: a 200 that is not an event stream made the SDK's
    ``get_final_message`` raise a bare AssertionError, which failed the task with a traceback
    (``processing_failed``) instead of being retried as the malformed reply it is."""
    from agentq.core.providers.anthropic_provider import AnthropicProvider

    from tests.fake_messages_api import FakeMessagesAPI, malformed_json
    from tests.fake_messages_api import FakeReply as MessagesReply

    with FakeMessagesAPI() as fake:
        fake.enqueue(malformed_json(), MessagesReply(200, {"not": "a message"}))
        sleeps = Sleeps()
        provider = AnthropicProvider(api_key="k", base_url=fake.base_url, retry=retry(), sleep=sleeps)
        with pytest.raises(ProviderError) as caught:
            provider.complete(request("claude-sonnet-4-6"))
    assert caught.value.code == "malformed_response" and not caught.value.retryable, caught.value
    assert len(sleeps) == 1 and len(fake.requests) == 2


@pytest.mark.parametrize("raw", ["-1", "lots", "1.5", "8k"])
def test_a_bad_stream_threshold_is_refused_at_startup_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    """Read per call, so refused when the engine's configuration is built, not at every call."""
    from agentq.control.defaults import ConfigurationError
    from agentq.core.providers.base import STREAM_ABOVE_VARIABLE
    from agentq.runtime import check_stream_above

    monkeypatch.setenv(STREAM_ABOVE_VARIABLE, raw)
    with pytest.raises(ConfigurationError, match=STREAM_ABOVE_VARIABLE):
        check_stream_above()
