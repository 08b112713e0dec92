"""Provider ``openai`` through the real ``openai`` SDK against a local server that speaks Chat
Completions as vLLM and Ollama do: the translation both ways (tools, tool calls and results,
system prompt), usage with cached tokens, stop reasons, and every failure mapped to the same
retry and failure codes as the Anthropic provider's; then the engine's tool loop on it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.parameters import base as parameters_base

from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ProviderError
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission, ToolsStep
from agentq.core.providers import LLMRequest, default_provider_factory
from agentq.core.providers.base import RetryNotice, reporting_retries
from agentq.core.providers.keys import OPENAI_SECRET_VARIABLE
from agentq.core.providers.openai_provider import OpenAIProvider
from agentq.core.providers.retry import RetryPolicy
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq_dev.moto_server import MotoServer

from tests.fake_model_servers import WEATHER_TOOL, FakeChatCompletions, FakeReply, Sleeps, chat_completion, chat_error

STORAGE = "memory"
MODEL = "gpt-4.1-mini"
# What a LiteLLM proxy answers when the upstream call it forwarded timed out.
LITELLM_TIMEOUT = {"error": {"message": "litellm.Timeout: APITimeoutError - Request timed out.", "type": None,
                             "param": None, "code": "408"}}  # fmt: skip


@pytest.fixture
def server() -> Iterator[FakeChatCompletions]:
    with FakeChatCompletions() as fake:
        yield fake


def provider(server: FakeChatCompletions, sleeps: Sleeps | None = None, attempts: int = 3) -> OpenAIProvider:
    return OpenAIProvider(
        api_key="sk-test",
        base_url=server.openai_base_url,
        retry=RetryPolicy(max_attempts=attempts, base_delay=0.01, max_delay=5),
        sleep=sleeps if sleeps is not None else Sleeps(),
    )


def request(messages: list[dict[str, Any]] | None = None, **kwargs: Any) -> LLMRequest:
    return LLMRequest(
        model=MODEL,
        system="You answer briefly.",
        messages=messages or [{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=256,
        **kwargs,
    )


def test_a_tool_call_round_trip_is_sent_as_chat_completions_and_read_back_as_messages_blocks(
    server: FakeChatCompletions,
) -> None:
    server.enqueue(chat_completion("Let me look.", [("get_weather", {"city": "Paris"})]))
    first = provider(server).complete(request())
    assert first.stop_reason == "tool_use" and first.model == MODEL
    text, use = first.content
    assert text == {"type": "text", "text": "Let me look."}
    assert use["type"] == "tool_use" and use["name"] == "get_weather" and use["input"] == {"city": "Paris"}

    sent = server.requests[0].body
    assert server.requests[0].path == "/v1/chat/completions"
    assert server.requests[0].headers["authorization"] == "Bearer sk-test"
    assert sent["messages"] == [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    assert sent["tools"] == [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                               "parameters": WEATHER_TOOL["input_schema"]}}]  # fmt: skip
    assert sent["max_tokens"] == 256

    server.enqueue(chat_completion("Sunny, 21C."))
    follow: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "sunny, 21C"}]},
    ]
    second = provider(server).complete(request(follow))
    assert second.content == [{"type": "text", "text": "Sunny, 21C."}] and second.stop_reason == "end_turn"
    assistant, tool = server.requests[1].body["messages"][2:]
    assert assistant == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [{"id": use["id"], "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
    }  # fmt: skip
    assert tool == {"role": "tool", "tool_call_id": use["id"], "content": "sunny, 21C"}


def test_cached_prompt_tokens_are_counted_as_cache_reads_not_twice(server: FakeChatCompletions) -> None:
    server.enqueue(chat_completion("ok", prompt_tokens=1000, completion_tokens=20, cached_tokens=800))
    usage = provider(server).complete(request()).usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (200, 800, 20)
    assert usage.input_total == 1000  # what the server billed as prompt tokens, once


@pytest.mark.parametrize("max_tokens", [1000, 32_000], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("completion_tokens", "cached"),
    [(2, None), (2, 6), (389, None)],
    ids=["reasoning_outside_completion", "outside_with_cached_prompt", "reasoning_inside_completion"],
)
def test_reasoning_tokens_a_server_counts_outside_completion_tokens_are_charged_as_output(
    server: FakeChatCompletions,
    monkeypatch: pytest.MonkeyPatch,
    max_tokens: int,
    completion_tokens: int,
    cached: int | None,
) -> None:
    """xAI's Chat Completions (and Gemini's OpenAI-compatible endpoint) count a reasoning model's
    thinking apart from ``completion_tokens`` and bill it as output: ``total_tokens`` is prompt +
    completion + reasoning. OpenAI's own counts it inside (total = prompt + completion). The
    output is what the total holds past the prompt (cached prompt tokens are inside
    ``prompt_tokens`` in both), so 387 billed reasoning tokens are charged whichever way the
    server counts them; reading ``completion_tokens`` alone charged 2."""
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "8192")
    reply = chat_completion("4", prompt_tokens=10, completion_tokens=completion_tokens, cached_tokens=cached)
    reply.body["usage"].update(total_tokens=399, completion_tokens_details={"reasoning_tokens": 387})
    server.enqueue(reply)
    answer = provider(server).complete(request().model_copy(update={"model": "grok-3-mini", "max_tokens": max_tokens}))
    usage = answer.usage
    assert answer.streamed == (max_tokens > 8192)
    assert (usage.input_total, usage.output_tokens, usage.total) == (10, 389, 399)
    assert usage.cache_read_input_tokens == (cached or 0)


@pytest.mark.parametrize(
    ("finish", "calls", "stop"),
    [("length", None, "max_tokens"), ("content_filter", None, "refusal"),
     ("stop", [("get_weather", {"city": "Oslo"})], "tool_use")],  # Ollama says "stop" for a tool call
)  # fmt: skip
def test_finish_reasons_become_the_stop_reasons_the_engine_reads(
    server: FakeChatCompletions, finish: str, calls: Any, stop: str
) -> None:
    server.enqueue(chat_completion("x", calls, finish_reason=finish))
    assert provider(server).complete(request()).stop_reason == stop


@pytest.mark.parametrize("max_tokens", [256, 32_000], ids=["whole", "streamed"])
def test_a_refusal_is_read_as_its_words_with_the_stop_reason_refusal(
    server: FakeChatCompletions, monkeypatch: pytest.MonkeyPatch, max_tokens: int
) -> None:
    """Chat Completions says a refusal in ``message.refusal`` (``content`` null, finish ``stop``):
    dropped, the turn was an empty answer that ended the task ``succeeded`` with nothing."""
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "8192")
    server.enqueue(chat_completion(None, refusal="I'm sorry, I can't help with that."))
    reply = provider(server).complete(request().model_copy(update={"max_tokens": max_tokens}))
    assert reply.content == [{"type": "text", "text": "I'm sorry, I can't help with that."}]
    assert (reply.stop_reason, reply.finish_reason, reply.streamed) == ("refusal", "stop", max_tokens > 8192)


def test_a_429_waits_for_the_servers_retry_after_then_succeeds(server: FakeChatCompletions) -> None:
    sleeps = Sleeps()
    server.enqueue(chat_error(429, "rate_limit_exceeded", "slow down", {"retry-after": "2"}), chat_completion("ok"))
    response = provider(server, sleeps).complete(request())
    assert response.attempts == 2 and sleeps == [2.0]


def test_server_errors_are_retried_and_the_last_one_is_a_retryable_provider_error(server: FakeChatCompletions) -> None:
    server.enqueue(*[chat_error(503, "server_error", "model is loading")] * 3)
    with pytest.raises(ProviderError) as caught:
        provider(server).complete(request())
    error = caught.value
    assert error.retryable and error.code == "provider_server_error" and error.attempts == 3
    assert error.message == "openai server error (503) after 3 attempts: model is loading"


def test_a_408_is_retried_and_fails_as_the_timeout_it_says_in_the_code_and_in_the_words(
    server: FakeChatCompletions,
) -> None:
    """A LiteLLM proxy's 408 is its upstream call timing out: a timeout, coded as one
    (``provider_timeout``: retried, fallen over from) and said as one at each retry and at the
    end. Before, each retry said "server error (408)" of a failure coded ``provider_rejected``."""
    server.enqueue(*[FakeReply(408, LITELLM_TIMEOUT)] * 3)
    notices: list[RetryNotice] = []
    with reporting_retries(notices.append), pytest.raises(ProviderError) as caught:
        provider(server).complete(request())
    said = "openai request timed out (408)"
    assert [(n.code, n.message.split(":")[0]) for n in notices] == [("provider_timeout", said)] * 2
    assert (caught.value.code, caught.value.retryable) == ("provider_timeout", True)
    assert caught.value.message == f"{said} after 3 attempts: litellm.Timeout: APITimeoutError - Request timed out."


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [(401, "invalid_api_key", "invalid_api_key"), (404, "model_not_found", "model_not_found"),
     (400, "invalid_request_error", "invalid_request")],
)  # fmt: skip
def test_a_request_the_server_will_never_accept_fails_at_once_with_its_code(
    server: FakeChatCompletions, status: int, kind: str, code: str
) -> None:
    server.enqueue(chat_error(status, kind, "no"))
    with pytest.raises(ProviderError) as caught:
        provider(server).complete(request())
    assert not caught.value.retryable and caught.value.code == code and len(server.requests) == 1
    assert caught.value.message == f"openai rejected the request ({status} {kind}): no"


def test_a_reply_that_is_not_json_is_retried_and_the_next_good_one_is_used(server: FakeChatCompletions) -> None:
    server.enqueue(FakeReply(200, raw=b'{"id": "chatcmpl-1", "obj'), chat_completion("ok"))
    response = provider(server).complete(request())
    assert response.attempts == 2 and response.content == [{"type": "text", "text": "ok"}]


@pytest.mark.parametrize(
    ("finish", "stop"), [("length", "max_tokens"), ("tool_calls", "malformed_output"), ("stop", "malformed_output")]
)
def test_a_tool_call_whose_arguments_are_not_a_json_object_is_left_out_of_a_turn_that_is_no_answer(
    server: FakeChatCompletions, finish: str, stop: str
) -> None:
    """Cut at the output limit (``length``) or JSON the model got wrong: the completion was read
    whole, its usage billed, so it is the answer (one attempt, its usage), the call left out
    (it can never be made) and the turn a cut one or a malformed one, which the engine ends the
    task on. Before, it was retried as a reply that is not a completion, every attempt billed."""
    calls = [("get_weather", {"city": "Oslo"}), ("get_weather", {})]
    reply = chat_completion("Checking.", calls, finish_reason=finish, prompt_tokens=400, completion_tokens=64)
    reply.body["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"] = '{"city": "Par'
    server.enqueue(reply, chat_completion("never read"))
    response = provider(server, attempts=2).complete(request())
    assert (response.attempts, response.stop_reason, response.finish_reason) == (1, stop, finish)
    assert [(b["type"], b.get("input")) for b in response.content] == [("text", None), ("tool_use", {"city": "Oslo"})]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (400, 64)


def test_a_server_that_is_not_there_is_a_retryable_unreachable_error() -> None:
    gone = OpenAIProvider(
        api_key="k", base_url="http://127.0.0.1:9/v1", retry=RetryPolicy(max_attempts=2, base_delay=0), sleep=Sleeps()
    )
    with pytest.raises(ProviderError) as caught:
        gone.complete(request())
    assert caught.value.retryable and caught.value.code == "provider_unreachable" and caught.value.attempts == 2


@pytest.mark.parametrize(
    ("provider_name", "variable", "value"),
    [
        ("openai", "OPENAI_BASE_URL", "127.0.0.1:9/v1"),
        ("openai", "OPENAI_BASE_URL", "localhost:8000/v1"),  # its host read as a scheme
        ("openai", "OPENAI_BASE_URL", ""),
        ("anthropic", "ANTHROPIC_BASE_URL", "127.0.0.1:9"),
        ("bedrock", "AGENTQ_BEDROCK_BASE_URL", "ftp://127.0.0.1:9"),
        ("bedrock-converse", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "127.0.0.1:9"),
    ],
)
def test_a_base_url_without_a_scheme_is_a_configuration_error_naming_its_variable(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, provider_name: str, variable: str,
    value: str,
) -> None:  # fmt: skip
    """Before, the SDK took it for a path (or its host for a scheme) and every call failed as a
    connection error: an outage to the retries, the model's circuit and the fallbacks, for a
    setting no retry fixes (Converse's botocore: a bare ValueError, ``processing_failed``)."""
    for name, setting in (("OPENAI_API_KEY", "k"), ("ANTHROPIC_API_KEY", "k"), ("AWS_REGION", "us-east-1"),
                          (variable, value)):  # fmt: skip
        monkeypatch.setenv(name, setting)
    model = {"openai": MODEL, "bedrock-converse": "amazon.nova-lite-v1:0"}.get(provider_name, "claude-sonnet-4-6")
    submission = TaskSubmission(goal="hi", provider=provider_name, model=model)  # type: ignore[arg-type]
    with pytest.raises(ProviderError) as caught:
        default_provider_factory(submission)
    failed = caught.value
    assert (failed.code, failed.retryable) == ("invalid_base_url", False)
    assert variable in failed.message and repr(value) in failed.message
    task = store.tasks.create(submission, tenant="t")
    result = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30)).run(task.task_id)
    assert result.status is TaskStatus.FAILED and (result.error or {}).get("code") == "invalid_base_url", result


def test_without_a_key_or_a_local_server_the_provider_fails_before_any_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProviderError) as caught:
        OpenAIProvider()
    assert caught.value.code == "missing_api_key" and not caught.value.retryable


# --- the engine's tool loop on it -------------------------------------------------------------


def test_a_task_runs_its_tool_loop_on_an_openai_compatible_server_and_is_priced(
    server: FakeChatCompletions, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server.enqueue(
        chat_completion(None, [("lookup", {"query": "a", "size": 30})], prompt_tokens=400, completion_tokens=30),
        chat_completion("found it", prompt_tokens=500, completion_tokens=10, cached_tokens=400),
    )
    submission = TaskSubmission(goal="look up a", provider="openai", model=MODEL)
    submission.constraints.tools = ["lookup"]
    task_id = store.tasks.create(submission, tenant="t").task_id
    result = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5)).run(task_id)
    assert result.status is TaskStatus.SUCCEEDED, result.error

    steps = [r.body for r in store.steps.load(task_id)]
    assert [type(s) for s in steps] == [LLMStep, ToolsStep, LLMStep]
    assert isinstance(steps[1], ToolsStep) and steps[1].results[0].content.startswith("result for a")
    tool_message = server.requests[1].body["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["content"].startswith("result for a")
    task = store.tasks.get(task_id)
    assert task.result == "found it"
    # gpt-4.1-mini a million tokens: $0.40 in, $1.60 out, $0.10 a cache read.
    first = (400 * Decimal("0.4") + 30 * Decimal("1.6")) / 1_000_000
    second = (100 * Decimal("0.4") + 400 * Decimal("0.1") + 10 * Decimal("1.6")) / 1_000_000
    assert task.cost_usd == first + second


def _cloudflare(status: int) -> FakeReply:
    page = f"<html><head><title>api.openai.com | {status}: Cloudflare</title></head></html>".encode()
    return FakeReply(status, raw=page, content_type="text/html")


@pytest.mark.parametrize(
    ("reply", "maybe_billed"),
    [(_cloudflare(520), True), (_cloudflare(524), True), (FakeReply(408, LITELLM_TIMEOUT), True),
     (_cloudflare(522), False), (_cloudflare(523), False)],
    ids=["cloudflare_520", "cloudflare_524", "litellm_408", "cloudflare_522", "cloudflare_523"],
)  # fmt: skip
def test_a_front_that_gave_up_on_a_call_it_had_sent_keeps_each_attempts_hold_counted_as_unknown(
    server: FakeChatCompletions, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch,
    reply: FakeReply, maybe_billed: bool,
) -> None:  # fmt: skip
    """Cloudflare answers 524 when the origin took the request and did not answer within its
    timeout (100 s by default: a long call), 520 when the origin's answer was empty or
    unreadable; a LiteLLM proxy answers 408 when the upstream call it forwarded timed out. The
    model may have run and billed each attempt, as behind a gateway's 502: every attempt's hold
    stays counted, as unknown. Before, they were taken for the API's own refusal and every hold
    went back (used 0). Cloudflare's 522 and 523 say it never reached the origin: nothing ran."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", '{"base_delay": 0.0, "max_delay": 0.0, "max_attempts": 3}')
    server.enqueue(*[reply] * 3)
    submission = TaskSubmission(goal="say done", provider="openai", model=MODEL)
    submission.constraints.tools = []
    task_id = store.tasks.create(submission, tenant="t").task_id
    Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5)).run(task_id)
    budget = store.budgets.get(task_id)
    assert len(server.requests) == 3 and budget.known == 0 and budget.reserved == 0
    if maybe_billed:
        assert budget.used == budget.unknown > 0 and budget.unknown % 3 == 0  # one hold an attempt
    else:
        assert (budget.used, budget.unknown) == (0, 0)


def test_openai_itself_is_sent_max_completion_tokens_and_a_compatible_server_max_tokens() -> None:
    own = OpenAIProvider(api_key="k")
    local = OpenAIProvider(api_key="k", base_url="http://127.0.0.1:8000/v1")
    assert own._limit == "max_completion_tokens" and local._limit == "max_tokens"


def test_the_key_in_the_named_secret_is_what_the_server_receives(
    server: FakeChatCompletions, moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint_url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
    monkeypatch.setattr(parameters_base, "DEFAULT_PROVIDERS", {})  # powertools' per-process cache
    name = f"agentq/openai-{uuid.uuid4().hex[:8]}"
    boto3.client("secretsmanager").create_secret(Name=name, SecretString=json.dumps({"OPENAI_API_KEY": "sk-secret"}))
    monkeypatch.setenv(OPENAI_SECRET_VARIABLE, name)
    server.enqueue(chat_completion("hi"))
    provider = default_provider_factory(TaskSubmission(goal="g", provider="openai", model=MODEL))
    provider.complete(request())
    assert server.requests[0].headers["authorization"] == "Bearer sk-secret"
