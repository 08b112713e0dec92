"""Provider ``bedrock-converse`` through real boto3 (``bedrock-runtime`` ``converse``, SigV4,
botocore's restJson1 parsing) against a local server speaking Converse's wire protocol: tool
use, the system prompt, cachePoint only where the model caches, reasoning, stop reasons,
usage, and throttles and errors mapped to the retry and failure codes every provider shares;
then the engine's tool loop on it."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ProviderError
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.core.providers import LLMRequest
from agentq.core.providers.bedrock_converse import BedrockConverseProvider
from agentq.core.providers.retry import RetryPolicy
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_model_servers import (
    WEATHER_TOOL,
    FakeConverse,
    FakeReply,
    Sleeps,
    converse_error,
    converse_reply,
    point_boto3_at,
)

STORAGE = "memory"
NOVA = "us.amazon.nova-pro-v1:0"
LLAMA = "meta.llama3-3-70b-instruct-v1:0"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeConverse]:
    with FakeConverse() as fake:
        point_boto3_at(fake, monkeypatch.setenv)
        yield fake


def provider(sleeps: Sleeps | None = None, attempts: int = 3) -> BedrockConverseProvider:
    return BedrockConverseProvider(
        region="us-east-1",
        retry=RetryPolicy(max_attempts=attempts, base_delay=0.01, max_delay=5),
        sleep=sleeps if sleeps is not None else Sleeps(),
    )


def request(model: str = NOVA, messages: list[dict[str, Any]] | None = None, **kwargs: Any) -> LLMRequest:
    return LLMRequest(
        model=model,
        system="You answer briefly.",
        messages=messages or [{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=256,
        **kwargs,
    )


def test_a_tool_use_round_trip_goes_through_converse_with_the_model_in_the_path(server: FakeConverse) -> None:
    server.enqueue(converse_reply("Let me look.", [("get_weather", {"city": "Paris"})]))
    first = provider().complete(request())
    assert first.stop_reason == "tool_use" and first.model == NOVA
    text, use = first.content
    assert text == {"type": "text", "text": "Let me look."}
    assert use["type"] == "tool_use" and use["name"] == "get_weather" and use["input"] == {"city": "Paris"}
    sent = server.requests[0]
    assert (
        sent.model == NOVA
        and sent.path.endswith("/converse")
        and sent.headers["authorization"].startswith("AWS4-HMAC-SHA256")
    )
    assert sent.body["system"] == [{"text": "You answer briefly."}, {"cachePoint": {"type": "default"}}]
    assert sent.body["inferenceConfig"] == {"maxTokens": 256}
    assert sent.body["toolConfig"]["tools"][0] == {
        "toolSpec": {"name": "get_weather", "description": "Weather for a city",
                     "inputSchema": {"json": WEATHER_TOOL["input_schema"]}}
    }  # fmt: skip

    server.enqueue(converse_reply("Sunny."))
    follow: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "sunny",
                                      "is_error": True}]},
    ]  # fmt: skip
    assert provider().complete(request(messages=follow)).content == [{"type": "text", "text": "Sunny."}]
    assistant, result = server.requests[1].body["messages"][1:]
    assert assistant["content"] == [
        {"text": "Let me look."},
        {"toolUse": {"toolUseId": use["id"], "name": "get_weather", "input": {"city": "Paris"}}},
    ]
    assert result["content"] == [
        {"toolResult": {"toolUseId": use["id"], "content": [{"text": "sunny"}], "status": "error"}},
        {"cachePoint": {"type": "default"}},  # the latest message: the rolling cache point
    ]


def test_a_model_without_prompt_caching_is_sent_no_cache_point(server: FakeConverse) -> None:
    server.enqueue(converse_reply("ok"))
    provider().complete(request(LLAMA))
    assert "cachePoint" not in str(server.requests[0].body)


def test_usage_keeps_cache_reads_and_writes_apart_and_stop_reasons_map(server: FakeConverse) -> None:
    server.enqueue(converse_reply("cut", stop_reason="max_tokens", input_tokens=50, output_tokens=256,
                                  cache_read=900, cache_write=100))  # fmt: skip
    response = provider().complete(request())
    assert response.stop_reason == "max_tokens"
    usage = response.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (50, 900, 100)
    server.enqueue(converse_reply("no", stop_reason="guardrail_intervened"))
    assert provider().complete(request()).stop_reason == "refusal"


def test_claude_reasoning_is_asked_for_and_sent_back_unchanged(server: FakeConverse) -> None:
    claude = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
    server.enqueue(converse_reply("42", reasoning=("think think", "sig-1")))
    first = provider().complete(request(claude, thinking_budget=2048))
    assert server.requests[0].body["additionalModelRequestFields"] == {
        "thinking": {"type": "enabled", "budget_tokens": 2048}
    }
    assert first.content[0] == {"type": "thinking", "thinking": "think think", "signature": "sig-1"}
    server.enqueue(converse_reply("ok"))
    follow: list[dict[str, Any]] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": first.content},
              {"role": "user", "content": "more"}]  # fmt: skip
    provider().complete(request(claude, messages=follow))
    assert server.requests[1].body["messages"][1]["content"][0] == {
        "reasoningContent": {"reasoningText": {"text": "think think", "signature": "sig-1"}}
    }


def test_a_throttle_is_retried_after_its_hint_and_counted(server: FakeConverse) -> None:
    sleeps = Sleeps()
    server.enqueue(converse_error(429, "ThrottlingException", "Too many requests", {"retry-after": "3"}),
                   converse_reply("ok"))  # fmt: skip
    response = provider(sleeps).complete(request())
    assert response.attempts == 2 and sleeps == [3.0]


def test_throttles_past_the_attempts_leave_a_retryable_rate_limited_error(server: FakeConverse) -> None:
    server.enqueue(*[converse_error(429, "ThrottlingException", "Too many requests")] * 2)
    with pytest.raises(ProviderError) as caught:
        provider(attempts=2).complete(request())
    error = caught.value
    assert error.retryable and error.code == "rate_limited" and error.status_code == 429
    assert error.message == "bedrock-converse rate limited (429) after 2 attempts: Too many requests"


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [(400, "ValidationException", "invalid_request"), (403, "AccessDeniedException", "permission_denied"),
     (404, "ResourceNotFoundException", "model_not_found")],
)  # fmt: skip
def test_a_request_bedrock_will_never_accept_fails_at_once_naming_its_exception(
    server: FakeConverse, status: int, kind: str, code: str
) -> None:
    server.enqueue(converse_error(status, kind, "no such thing"))
    with pytest.raises(ProviderError) as caught:
        provider().complete(request())
    assert not caught.value.retryable and caught.value.code == code and len(server.requests) == 1
    assert caught.value.message == f"bedrock-converse rejected the request ({status} {kind}): no such thing"


@pytest.mark.parametrize(("status", "maybe_billed"), [(524, True), (520, True), (522, False), (503, False)])
def test_a_front_that_gave_up_on_a_call_it_had_sent_leaves_it_possibly_billed_and_one_that_never_sent_it_not(
    server: FakeConverse, status: int, maybe_billed: bool
) -> None:
    """botocore's answer for a status is read as the other SDKs' are (``retry.error_status_answered``):
    a front's 524 or 520 (the origin took the call and did not answer in time, or answered what it
    could not read) may have been billed; its 522 (the origin never reached) and the service's own
    503 were not."""
    page = f"<html><head><title>{status}: Cloudflare</title></head></html>".encode()
    server.enqueue(*[FakeReply(status, raw=page, content_type="text/html")] * 2)
    with pytest.raises(ProviderError) as caught:
        provider(attempts=2).complete(request())
    assert (caught.value.status_code, caught.value.retryable, caught.value.maybe_billed) == (status, True, maybe_billed)


def test_a_reply_of_another_shape_is_retried_then_fails_the_task(server: FakeConverse) -> None:
    server.enqueue(FakeReply(200, {"status": "ok"}), FakeReply(200, raw=b"<html>gateway</html>"))
    with pytest.raises(ProviderError) as caught:
        provider(attempts=2).complete(request())
    assert caught.value.code == "malformed_response" and not caught.value.retryable


def test_without_aws_credentials_the_call_fails_at_once(server: FakeConverse, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(ProviderError) as caught:
        provider().complete(request())
    assert caught.value.code == "missing_aws_credentials" and not server.requests


def test_a_task_runs_its_tool_loop_on_a_converse_model_and_is_priced(
    server: FakeConverse, store: Storage, registry: ToolRegistry
) -> None:
    server.enqueue(
        converse_reply(None, [("lookup", {"query": "a", "size": 30})], input_tokens=400, output_tokens=30),
        converse_reply("found it", input_tokens=100, output_tokens=10, cache_read=400),
    )
    submission = TaskSubmission(goal="look up a", provider="bedrock-converse", model=NOVA)
    submission.constraints.tools = ["lookup"]
    task_id = store.tasks.create(submission, tenant="t").task_id
    result = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5)).run(task_id)
    assert result.status is TaskStatus.SUCCEEDED, result.error
    tool_turn = server.requests[1].body["messages"][-1]["content"][0]["toolResult"]
    assert tool_turn["content"][0]["text"].startswith("result for a")
    # amazon.nova-pro a million tokens: $0.80 in, $3.20 out, $0.20 a cache read.
    first = (400 * Decimal("0.8") + 30 * Decimal("3.2")) / 1_000_000
    second = (100 * Decimal("0.8") + 400 * Decimal("0.2") + 10 * Decimal("3.2")) / 1_000_000
    assert store.tasks.get(task_id).cost_usd == first + second


def test_a_model_without_reasoning_taking_over_a_claude_conversation_is_sent_no_thinking(server: FakeConverse) -> None:
    server.enqueue(converse_reply("ok"))
    claude_turn = [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "first"}]
    follow: list[dict[str, Any]] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": claude_turn},
              {"role": "user", "content": "more"}]  # fmt: skip
    provider().complete(request(LLAMA, messages=follow))
    assert server.requests[0].body["messages"][1]["content"] == [{"text": "first"}]
