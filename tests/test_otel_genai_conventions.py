"""The OpenTelemetry agentq exports (``observe/otel.py``, ``observe/otel_metrics.py``) held to
OpenTelemetry's GenAI semantic conventions, as they are written, not as our code names them.

What a span or a metric must carry is written below as data, copied from the conventions:
repository open-telemetry/semantic-conventions-genai (where the GenAI conventions moved from
open-telemetry/semantic-conventions), ``docs/gen-ai/gen-ai-spans.md`` (Inference span
``gen_ai.inference.client``, Execute tool span ``gen_ai.execute_tool.internal``),
``docs/gen-ai/gen-ai-agent-spans.md`` (Invoke agent internal span ``gen_ai.invoke_agent.internal``:
an agent run by the same service that invokes it) and ``docs/gen-ai/gen-ai-metrics.md``
(``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``), as of August 2026.

Each span and each metric point is received by a local OTLP/HTTP receiver from the real
exporters, for a task per provider (Anthropic, OpenAI, Bedrock Converse, each a local server of
its wire format), a failed call, and a conversation of several answers (one ``invoke_agent`` per
answer, every span id unique, every run under its own answer's span).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agentq.control.operations import raise_budget
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import Task, TaskStatus, TaskSubmission
from agentq.core.providers import LLMRequest, LLMResponse, default_provider_factory
from agentq.core.tools import ToolRegistry
from agentq.observe import otel
from agentq.storage.container import Storage

from tests.fake_messages_api import (
    FakeMessagesAPI,
    invalid_request,
    overloaded,
    point_anthropic_at,
    text_reply,
    tool_use_reply,
    usage_dict,
)
from tests.fake_model_servers import (
    FakeChatCompletions,
    FakeConverse,
    chat_completion,
    chat_error,
    converse_reply,
    point_boto3_at,
)
from tests.helpers import scripted
from tests.otlp_receiver import HistogramPoint, OtlpReceiver, ReceivedSpan

STORAGE = "memory"

# --- the conventions, as written ------------------------------------------------------------

INTERNAL, CLIENT = 1, 3  # opentelemetry.proto.trace.v1.Span.SpanKind


@dataclass(frozen=True)
class SpanConvention:
    """One span type of the conventions: its kind, the attribute whose value ends its name, and
    its attributes by requirement level. ``conditional`` maps each conditionally required
    attribute to its condition, as the conventions word it."""

    kind: int
    name_attribute: str
    required: frozenset[str]
    conditional: dict[str, str]
    recommended: frozenset[str]
    opt_in: frozenset[str]

    @property
    def names(self) -> frozenset[str]:
        return self.required | set(self.conditional) | self.recommended | self.opt_in


# gen-ai-spans.md, "Inference": span name `{gen_ai.operation.name} {gen_ai.request.model}`;
# kind SHOULD be CLIENT (a model behind HTTP).
INFERENCE = SpanConvention(
    kind=CLIENT,
    name_attribute="gen_ai.request.model",
    required=frozenset({"gen_ai.operation.name", "gen_ai.provider.name"}),
    conditional={
        "error.type": "if the operation ended in an error",
        "gen_ai.conversation.id": "when available",
        "gen_ai.output.type": "when applicable and if the request includes an output format",
        "gen_ai.request.choice.count": "if available, in the request, and !=1",
        "gen_ai.request.model": "If available.",
        "gen_ai.request.seed": "if applicable and if the request includes a seed",
        "gen_ai.request.stream": "If and only if the request is streaming.",
        "gen_ai.request.top_k": "if applicable",
        "server.port": "If `server.address` is set.",
    },
    recommended=frozenset(
        {
            "gen_ai.request.frequency_penalty",
            "gen_ai.request.max_tokens",
            "gen_ai.request.presence_penalty",
            "gen_ai.request.stop_sequences",
            "gen_ai.request.temperature",
            "gen_ai.request.top_p",
            "gen_ai.response.finish_reasons",
            "gen_ai.response.id",
            "gen_ai.response.model",
            "gen_ai.response.time_to_first_chunk",
            "gen_ai.usage.audio.input_tokens",
            "gen_ai.usage.audio.output_tokens",
            "gen_ai.usage.cache_creation.input_tokens",
            "gen_ai.usage.cache_read.input_tokens",
            "gen_ai.usage.image.input_tokens",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "gen_ai.usage.reasoning.output_tokens",
            "gen_ai.usage.text.input_tokens",
            "gen_ai.usage.text.output_tokens",
            "gen_ai.usage.video.input_tokens",
            "server.address",
        }
    ),
    opt_in=frozenset(
        {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "gen_ai.tool.definitions"}
    ),
)

# gen-ai-agent-spans.md, "Invoke agent internal span": name `invoke_agent {gen_ai.agent.name}`;
# kind SHOULD be INTERNAL.
INVOKE_AGENT = SpanConvention(
    kind=INTERNAL,
    name_attribute="gen_ai.agent.name",
    required=frozenset({"gen_ai.operation.name", "gen_ai.provider.name"}),
    conditional={
        "error.type": "if the operation ended in an error",
        "gen_ai.agent.description": "when available",
        "gen_ai.agent.id": "if applicable.",
        "gen_ai.agent.name": "when available",
        "gen_ai.agent.version": "when available",
        "gen_ai.conversation.id": "when available",
        "gen_ai.data_source.id": "if applicable.",
        "gen_ai.output.type": "when applicable and if the request includes an output format",
        "gen_ai.request.choice.count": "if available, in the request, and !=1",
        "gen_ai.request.model": "If available.",
        "gen_ai.request.seed": "if applicable and if the request includes a seed",
    },
    recommended=frozenset(
        {
            "gen_ai.request.frequency_penalty",
            "gen_ai.request.max_tokens",
            "gen_ai.request.presence_penalty",
            "gen_ai.request.stop_sequences",
            "gen_ai.request.temperature",
            "gen_ai.request.top_p",
            "gen_ai.response.finish_reasons",
            "gen_ai.usage.audio.input_tokens",
            "gen_ai.usage.audio.output_tokens",
            "gen_ai.usage.cache_creation.input_tokens",
            "gen_ai.usage.cache_read.input_tokens",
            "gen_ai.usage.image.input_tokens",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "gen_ai.usage.text.input_tokens",
            "gen_ai.usage.text.output_tokens",
            "gen_ai.usage.video.input_tokens",
        }
    ),
    opt_in=frozenset(
        {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "gen_ai.tool.definitions"}
    ),
)

# gen-ai-spans.md, "Execute tool span": name `execute_tool {gen_ai.tool.name}`; kind SHOULD be INTERNAL.
EXECUTE_TOOL = SpanConvention(
    kind=INTERNAL,
    name_attribute="gen_ai.tool.name",
    required=frozenset({"gen_ai.operation.name", "gen_ai.tool.name"}),
    conditional={"error.type": "if the operation ended in an error"},
    recommended=frozenset({"gen_ai.tool.call.id", "gen_ai.tool.description", "gen_ai.tool.type"}),
    opt_in=frozenset({"gen_ai.tool.call.arguments", "gen_ai.tool.call.result"}),
)


@dataclass(frozen=True)
class MetricConvention:
    unit: str
    buckets: tuple[float, ...]  # the ExplicitBucketBoundaries it SHOULD be specified with
    required: frozenset[str]
    conditional: dict[str, str]
    recommended: frozenset[str]


# gen-ai-metrics.md
TOKEN_USAGE = MetricConvention(
    unit="{token}",
    buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864),
    required=frozenset({"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.token.type"}),
    conditional={"gen_ai.request.model": "If available.", "server.port": "If `server.address` is set."},
    recommended=frozenset({"gen_ai.response.model", "server.address"}),
)
OPERATION_DURATION = MetricConvention(
    unit="s",
    buckets=(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92),
    required=frozenset({"gen_ai.operation.name"}),
    conditional={
        "error.type": "If the operation ended in an error.",
        "gen_ai.provider.name": "If the operation involves a call to a GenAI provider.",
        "gen_ai.request.model": "If available.",
        "server.port": "If `server.address` is set.",
    },
    recommended=frozenset({"gen_ai.response.model", "server.address"}),
)
# Well-known gen_ai.provider.name values (gen-ai-spans.md) of the providers agentq speaks to.
WELL_KNOWN_PROVIDERS = {"anthropic": "anthropic", "openai": "openai", "bedrock-converse": "aws.bedrock"}


def check_span(span: ReceivedSpan, convention: SpanConvention, applies: set[str]) -> None:
    """``span`` is of its convention's kind and name, carries every required attribute and each
    conditionally required one whose condition ``applies``, and nothing in the ``gen_ai.*``
    namespace that its convention does not define; an ``error.type`` only if it failed."""
    assert span.kind == convention.kind, (span.name, span.kind)
    attributes = span.attributes
    assert span.name == f"{attributes['gen_ai.operation.name']} {attributes[convention.name_attribute]}"
    assert convention.required <= set(attributes), (span.name, convention.required - set(attributes))
    assert applies <= set(convention.conditional) | convention.recommended  # the test's own slip
    missing = {a for a in applies if a not in attributes}
    assert not missing, (span.name, missing)
    ours = {a for a in attributes if a.startswith(("gen_ai.", "server.")) or a == "error.type"}
    assert ours <= convention.names, (span.name, ours - convention.names)
    if "server.address" in attributes:
        assert "server.port" in attributes, span.name  # conditionally required with it
    assert ("error.type" in attributes) == (span.status_code == 2), (span.name, span.status_code)


def check_points(points: list[HistogramPoint], convention: MetricConvention, applies: set[str]) -> None:
    assert points
    for point in points:
        assert point.unit == convention.unit and point.bounds == [float(b) for b in convention.buckets]
        assert convention.required <= set(point.attributes), convention.required - set(point.attributes)
        assert applies <= set(point.attributes), applies - set(point.attributes)
        assert set(point.attributes) <= convention.required | set(convention.conditional) | convention.recommended
        if "server.address" in point.attributes:
            assert "server.port" in point.attributes


# --- the runs ---------------------------------------------------------------------------------


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as received:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", received.endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "agentq-test")
        monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", json.dumps({"max_attempts": 1, "base_delay": 0, "max_delay": 0}))
        otel.reset()
        yield received
        otel.reset()


def run(store: Storage, registry: ToolRegistry, task_id: str) -> TaskStatus | None:
    engine = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=30))
    return engine.run(task_id, keeper=lambda _: contextlib.nullcontext()).status


@dataclass
class Provider:
    """A provider's local server, what it answers a turn that calls ``lookup`` and one that
    answers, and the finish reasons and reply ids its own wire format says for them."""

    name: str
    model: str
    serve: Callable[[pytest.MonkeyPatch], contextlib.AbstractContextManager[Any]]
    replies: Callable[[], list[Any]]
    finish_reasons: list[str]  # the provider's own, for the two replies
    reply_ids: Callable[[list[Any]], list[str | None]]


@contextlib.contextmanager
def anthropic_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with FakeMessagesAPI() as server:
        point_anthropic_at(server, monkeypatch.setenv)
        yield server


@contextlib.contextmanager
def openai_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with FakeChatCompletions() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        yield server


@contextlib.contextmanager
def converse_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with FakeConverse() as server:
        point_boto3_at(server, monkeypatch.setenv)
        yield server


PROVIDERS = [
    Provider(
        "anthropic", "claude-sonnet-4-6", anthropic_server,
        lambda: [tool_use_reply("lookup", {"query": "q"}, usage=usage_dict(30, 8)),
                 text_reply("done", usage=usage_dict(50, 4, cache_read_input_tokens=20))],
        ["tool_use", "end_turn"], lambda replies: [r.body["id"] for r in replies],
    ),
    Provider(
        "openai", "gpt-4.1-mini", openai_server,
        lambda: [chat_completion(tool_calls=[("lookup", {"query": "q"})], prompt_tokens=30, completion_tokens=8),
                 chat_completion("done", prompt_tokens=70, completion_tokens=4, cached_tokens=20)],
        ["tool_calls", "stop"], lambda replies: [r.body["id"] for r in replies],
    ),
    # Converse replies carry no id of the completion (only the HTTP request's): none is reported.
    Provider(
        "bedrock-converse", "amazon.nova-lite-v1:0", converse_server,
        lambda: [converse_reply(tool_uses=[("lookup", {"query": "q"})], input_tokens=30, output_tokens=8),
                 converse_reply("done", input_tokens=50, output_tokens=4, cache_read=20)],
        ["tool_use", "end_turn"], lambda replies: [None, None],
    ),
]  # fmt: skip


def submission(provider: Provider, **fields: Any) -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "goal": "look it up",
            "provider": provider.name,
            "model": provider.model,
            "constraints": {"tools": ["lookup"]},
            **fields,
        }
    )


def server_address(server: Any) -> tuple[str, int]:
    """Where the provider's local server listens, from the URL the provider was pointed at."""
    url = urllib.parse.urlsplit(server.base_url)
    return str(url.hostname), int(url.port or 0)


@pytest.mark.parametrize("provider", PROVIDERS, ids=[p.name for p in PROVIDERS])
def test_each_provider_s_spans_and_metrics_carry_what_the_genai_conventions_require(
    provider: Provider, receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    replies = provider.replies()
    with provider.serve(monkeypatch) as server:
        server.enqueue(*replies)
        task = store.tasks.create(submission(provider, agent="researcher@2"), tenant="t")
        assert run(store, registry, task.task_id) is TaskStatus.SUCCEEDED
        address = server_address(server)
    spans = receiver.spans
    assert len({s.span_id for s in spans}) == len(spans)

    chats = sorted((s for s in spans if s.name.startswith("chat ")), key=lambda s: s.start_ns)
    assert len(chats) == 2
    for chat, finish, reply_id in zip(chats, provider.finish_reasons, provider.reply_ids(replies), strict=True):
        applies = {"gen_ai.conversation.id", "gen_ai.request.model", "server.port", "server.address",
                   "gen_ai.request.max_tokens", "gen_ai.response.finish_reasons", "gen_ai.response.model",
                   "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"}  # fmt: skip
        check_span(chat, INFERENCE, applies | ({"gen_ai.response.id"} if reply_id else set()))
        attributes = chat.attributes
        assert attributes["gen_ai.provider.name"] == WELL_KNOWN_PROVIDERS[provider.name]
        assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.model"] == provider.model
        assert attributes["gen_ai.response.finish_reasons"] == [finish]  # the provider's own word, not ours
        assert attributes.get("gen_ai.response.id") == reply_id
        assert (attributes["server.address"], attributes["server.port"]) == address
        assert attributes["gen_ai.conversation.id"] == task.task_id
        # Set if and only if the call streamed: every Anthropic API call does (its stream tells
        # the usage as it goes), the others only past AGENTQ_STREAM_ABOVE_TOKENS.
        assert attributes.get("gen_ai.request.stream") is (True if provider.name == "anthropic" else None)
    assert chats[1].attributes["gen_ai.usage.cache_read.input_tokens"] == 20

    (tool,) = [s for s in spans if s.name.startswith("execute_tool ")]
    check_span(tool, EXECUTE_TOOL, {"gen_ai.tool.call.id", "gen_ai.tool.description", "gen_ai.tool.type"})
    assert tool.attributes["gen_ai.tool.name"] == "lookup" and tool.attributes["gen_ai.tool.type"] == "function"
    assert tool.attributes["gen_ai.tool.description"] == registry.get("lookup").description  # type: ignore[union-attr]

    (agent,) = [s for s in spans if s.name.startswith("invoke_agent")]
    check_span(agent, INVOKE_AGENT, {"gen_ai.agent.id", "gen_ai.agent.name", "gen_ai.agent.version",
                                     "gen_ai.conversation.id", "gen_ai.request.model", "gen_ai.usage.input_tokens",
                                     "gen_ai.usage.output_tokens"})  # fmt: skip
    attributes = agent.attributes
    assert agent.name == "invoke_agent researcher" and attributes["gen_ai.agent.version"] == "2"
    assert attributes["gen_ai.agent.id"] == "t/researcher"
    assert attributes["gen_ai.provider.name"] == WELL_KNOWN_PROVIDERS[provider.name]
    assert attributes["gen_ai.conversation.id"] == task.task_id
    for kind in ("input", "output"):  # the agent's usage is its calls'
        total = sum(c.attributes[f"gen_ai.usage.{kind}_tokens"] for c in chats)
        assert attributes[f"gen_ai.usage.{kind}_tokens"] == total > 0

    metric_applies = {"gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model", "server.address",
                      "server.port"}  # fmt: skip
    otel.flush(metrics=True)  # a long-lived worker's periodic reader sends them every minute
    durations = receiver.histogram("gen_ai.client.operation.duration")
    check_points(durations, OPERATION_DURATION, metric_applies)
    assert sum(p.count for p in durations) == 2 and all("error.type" not in p.attributes for p in durations)
    assert {p.attributes["server.address"] for p in durations} == {address[0]}
    usage = receiver.histogram("gen_ai.client.token.usage")
    check_points(usage, TOKEN_USAGE, metric_applies)
    for kind in ("input", "output"):
        points = [p for p in usage if p.attributes["gen_ai.token.type"] == kind]
        assert sum(p.count for p in points) == 2
        assert sum(p.sum for p in points) == sum(c.attributes[f"gen_ai.usage.{kind}_tokens"] for c in chats)


def test_a_failed_call_names_its_error_type_on_its_span_its_agent_s_span_and_its_duration(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = PROVIDERS[1]
    with openai_server(monkeypatch) as server:
        server.enqueue(chat_error(400, "invalid_request_error", "messages: too long"))
        task = store.tasks.create(submission(provider), tenant="t")
        assert run(store, registry, task.task_id) is TaskStatus.FAILED
    error = store.tasks.get(task.task_id).error
    assert error is not None
    (chat,) = [s for s in receiver.spans if s.name.startswith("chat ")]
    check_span(chat, INFERENCE, {"error.type", "gen_ai.request.model", "server.port", "gen_ai.conversation.id"})
    assert chat.attributes["error.type"] == error["code"]
    (agent,) = [s for s in receiver.spans if s.name.startswith("invoke_agent")]
    # A task submitted without an agent definition is its own agent: no version to name.
    check_span(agent, INVOKE_AGENT, {"error.type", "gen_ai.agent.id", "gen_ai.agent.name", "gen_ai.conversation.id"})
    assert agent.attributes["error.type"] == error["code"] and agent.attributes["gen_ai.agent.id"] == task.task_id
    otel.flush(metrics=True)  # a long-lived worker's periodic reader sends them every minute
    (duration,) = receiver.histogram("gen_ai.client.operation.duration")
    check_points([duration], OPERATION_DURATION, {"error.type", "gen_ai.provider.name", "server.port"})
    assert duration.attributes["error.type"] == error["code"]
    assert receiver.histogram("gen_ai.client.token.usage") == []  # no answer, no usage


@pytest.mark.parametrize(
    ("provider", "stream_above", "streamed"),
    [(PROVIDERS[0], None, True), (PROVIDERS[1], "0", True), (PROVIDERS[1], None, False)],
    ids=["anthropic", "openai-streamed", "openai-whole"],
)
def test_a_failed_calls_span_says_whether_the_request_streamed(
    provider: Provider,
    stream_above: str | None,
    streamed: bool,
    receiver: OtlpReceiver,
    store: Storage,
    registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gen_ai.request.stream`` is set "if and only if the request is streaming", whatever the
    call's end: every Anthropic API call streams, an OpenAI call past AGENTQ_STREAM_ABOVE_TOKENS."""
    if stream_above is not None:
        monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", stream_above)
    with provider.serve(monkeypatch) as server:
        server.enqueue(overloaded() if provider.name == "anthropic" else chat_error(400, "invalid_request_error", "no"))
        task = store.tasks.create(submission(provider), tenant="t")
        run(store, registry, task.task_id)
    (chat,) = [s for s in receiver.spans if s.name.startswith("chat ")]
    assert chat.status_code == 2 and "error.type" in chat.attributes
    assert chat.attributes.get("gen_ai.request.stream") is (True if streamed else None)


def test_a_rubric_grading_call_is_a_chat_span_and_a_point_of_the_genai_client_metrics(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grading model's call is a model call agentq makes, as the agent's are: its span
    carries what the conventions ask of an inference span, and it is a point of each metric."""
    from agentq.control.submit import parse_submission

    provider = PROVIDERS[0]
    with provider.serve(monkeypatch) as server:
        server.enqueue(text_reply("the answer", usage=usage_dict(20, 4)),
                       text_reply('{"score": 1.0, "feedback": "fine"}', usage=usage_dict(30, 6)))  # fmt: skip
        body = {"goal": "hi", "provider": provider.name, "model": provider.model,
                "outcome": {"rubric": "Score 1.0 if it answers."}}  # fmt: skip
        task = store.tasks.create(parse_submission(body), tenant="t")
        assert run(store, registry, task.task_id) is TaskStatus.SUCCEEDED
        assert server.pending == 0
        address = server_address(server)
    otel.reset()  # flushes the metrics
    agents: list[ReceivedSpan] = []
    graders: list[ReceivedSpan] = []
    for chat in (s for s in receiver.spans if s.name.startswith("chat ")):
        (graders if chat.attributes.get("agentq.grade") else agents).append(chat)
    assert len(agents) == len(graders) == 1
    (grading,) = graders
    check_span(grading, INFERENCE, {"gen_ai.conversation.id", "gen_ai.request.model", "server.port", "server.address",
                                    "gen_ai.request.max_tokens", "gen_ai.response.finish_reasons",
                                    "gen_ai.response.model", "gen_ai.usage.input_tokens",
                                    "gen_ai.usage.output_tokens"})  # fmt: skip
    assert (grading.attributes["server.address"], grading.attributes["server.port"]) == address
    assert grading.attributes["gen_ai.usage.output_tokens"] == 6
    assert grading.attributes["gen_ai.conversation.id"] == task.task_id
    durations = receiver.histogram("gen_ai.client.operation.duration")
    check_points(durations, OPERATION_DURATION, {"gen_ai.provider.name", "gen_ai.response.model", "server.port"})
    assert sum(p.count for p in durations) == 2
    usage = receiver.histogram("gen_ai.client.token.usage")
    assert sum(p.sum for p in usage if p.attributes["gen_ai.token.type"] == "output") == 4 + 6


def test_the_fallback_event_names_the_provider_by_the_conventions_value(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An overloaded Claude falls back to a Converse model: the ``agentq.fallback`` event names
    the model it goes to under the conventions' ``gen_ai.provider.name``, in their value
    (``aws.bedrock``, as the fallback's own chat span says), not agentq's ``bedrock-converse``."""
    claude, nova = PROVIDERS[0], PROVIDERS[2]
    with claude.serve(monkeypatch) as first, nova.serve(monkeypatch) as second:
        first.enqueue(overloaded())
        second.enqueue(converse_reply("nova answered"))
        fallbacks = [{"provider": nova.name, "model": nova.model}]
        task = store.tasks.create(submission(claude, fallbacks=fallbacks), tenant="t")
        assert run(store, registry, task.task_id) is TaskStatus.SUCCEEDED
    (event,) = [a for s in receiver.spans for n, a in s.events if n == "agentq.fallback"]
    (chat,) = [s for s in receiver.spans if s.name == f"chat {nova.model}"]
    assert event["gen_ai.provider.name"] == chat.attributes["gen_ai.provider.name"] == "aws.bedrock"
    assert event["gen_ai.request.model"] == nova.model


def emf_total(out: str, metric: str) -> float:
    """``metric`` summed over the EMF documents printed to ``out``."""
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"_aws"' in line]
    values = [doc[metric] for doc in docs if metric in doc]
    return sum(sum(v) if isinstance(v, list) else v for v in values)


@pytest.mark.parametrize("answered", [True, False], ids=["answered", "errored"])
def test_an_economy_tasks_batched_call_is_a_chat_span_from_its_submission_and_a_point_of_each_metric(
    answered: bool,
    receiver: OtlpReceiver,
    store: Storage,
    registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A turn sent as a batch is a model call too, its answer read by a later run: that run
    sends its ``chat`` span, from the batch's submission to the read, and its points of the GenAI
    client metrics (an errored request's with ``error.type``), and its tokens go to the EMF
    metrics. A look before the batch ended sends none (the call is not over)."""
    import time

    from agentq.control.submit import parse_submission
    from agentq.observe import names

    monkeypatch.setenv("AGENTQ_EMF", "1")
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    provider = PROVIDERS[0]
    with FakeMessagesAPI(batch_seconds=1.0) as server:
        point_anthropic_at(server, monkeypatch.setenv)
        server.enqueue(text_reply("batched answer", usage=usage_dict(40, 7)) if answered else invalid_request())
        body = {"goal": "hi", "provider": provider.name, "model": provider.model, "constraints": {"economy": True}}
        task = store.tasks.create(parse_submission(body), tenant="t")
        engine = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=30))

        def claimed() -> str:
            return engine.run(task.task_id, keeper=lambda _: contextlib.nullcontext()).outcome

        assert claimed() == "waiting"  # sent
        batch = store.tasks.get(task.task_id).batch
        assert batch is not None
        store.tasks.transition(task.task_id, TaskStatus.QUEUED)  # what the poll message does
        assert claimed() == "waiting"  # looked at before it ended
        time.sleep(1.1)
        store.tasks.transition(task.task_id, TaskStatus.QUEUED)
        assert claimed() == "finished"
        address = server_address(server)
    ended = store.tasks.get(task.task_id)
    assert ended.status is (TaskStatus.SUCCEEDED if answered else TaskStatus.FAILED)
    submitted = min(s.start_ns for s in receiver.spans if s.name == "run")
    otel.reset()  # flushes the metrics
    (chat,) = [s for s in receiver.spans if s.name.startswith("chat ")]
    applies = {"gen_ai.conversation.id", "gen_ai.request.model", "server.port", "server.address",
               "gen_ai.request.max_tokens"}  # fmt: skip
    if answered:
        applies |= {"gen_ai.response.model", "gen_ai.response.finish_reasons", "gen_ai.usage.output_tokens"}
    check_span(chat, INFERENCE, applies | (set() if answered else {"error.type"}))
    assert (chat.attributes["server.address"], chat.attributes["server.port"]) == address
    assert chat.attributes["agentq.batch_id"] == batch["id"]
    assert "gen_ai.request.stream" not in chat.attributes
    assert submitted <= chat.start_ns and chat.end_ns - chat.start_ns >= 1e9  # from its submission, not its read
    (read,) = [s for s in receiver.spans if s.span_id == chat.parent_span_id]
    assert read.name == "step 1" and read.start_ns > chat.start_ns  # under the step of the run that read it
    (duration,) = receiver.histogram("gen_ai.client.operation.duration")
    assert duration.count == 1 and duration.sum >= 1
    assert ("error.type" in duration.attributes) is not answered
    usage = receiver.histogram("gen_ai.client.token.usage")
    assert sum(p.sum for p in usage if p.attributes["gen_ai.token.type"] == "output") == (7 if answered else 0)
    assert emf_total(capsys.readouterr().out, names.TOKENS_OUT) == (7 if answered else 0)


def invocations(spans: list[ReceivedSpan], task: Task) -> list[ReceivedSpan]:
    return sorted(
        (s for s in spans if s.name.startswith("invoke_agent") and s.attributes["agentq.task_id"] == task.task_id),
        key=lambda s: s.start_ns,
    )


def check_tree(spans: list[ReceivedSpan]) -> None:
    """Every span id once; every span but the root under a span that arrived; every run directly
    under an ``invoke_agent`` span, every chat and tool call under a run."""
    ids = {s.span_id: s for s in spans}
    assert len(ids) == len(spans), "a span id was sent twice"
    roots = [s for s in spans if s.parent_span_id is None]
    assert roots and all(r.name.startswith("invoke_agent") for r in roots)  # a root task's invocations
    for s in spans:
        if s.parent_span_id is not None:
            assert s.parent_span_id in ids, f"{s.name} hangs from a span that never arrived"
        if s.name == "run":
            assert ids[s.parent_span_id].name.startswith("invoke_agent")  # type: ignore[index]


def under(spans: list[ReceivedSpan], ancestor: ReceivedSpan) -> list[ReceivedSpan]:
    ids = {s.span_id: s for s in spans}

    def descends(s: ReceivedSpan) -> bool:
        while s.parent_span_id is not None:
            if s.parent_span_id == ancestor.span_id:
                return True
            s = ids[s.parent_span_id]
        return False

    return [s for s in spans if descends(s)]


@pytest.mark.parametrize("answers", [2, 4])
def test_a_conversation_sends_one_invoke_agent_span_per_answer_each_with_its_own_id_and_runs(
    answers: int, receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = PROVIDERS[0]
    with anthropic_server(monkeypatch) as server:
        task = store.tasks.create(submission(provider), tenant="t")
        for n in range(answers):
            if n:
                store.messages.accept(task.task_id, f"follow-up {n}")
            # The second answer calls a tool first: its invocation holds two calls.
            if n == 1:
                server.enqueue(tool_use_reply("lookup", {"query": "q"}, usage=usage_dict(40 + n, 3)))
            server.enqueue(text_reply(f"answer {n}", usage=usage_dict(100 * (n + 1), 5 + n)))
            assert run(store, registry, task.task_id) is TaskStatus.SUCCEEDED
    spans = receiver.spans
    check_tree(spans)
    agents = invocations(spans, task)
    assert len(agents) == answers and len({a.span_id for a in agents}) == answers
    assert {a.attributes["gen_ai.conversation.id"] for a in agents} == {task.task_id}
    for earlier, later in itertools.pairwise(agents):
        assert earlier.end_ns <= later.start_ns  # the next exchange starts after the answer before
    for n, agent in enumerate(agents):
        check_span(agent, INVOKE_AGENT, {"gen_ai.conversation.id", "gen_ai.usage.input_tokens"})
        chats = [s for s in under(spans, agent) if s.name.startswith("chat ")]
        assert len(chats) == (2 if n == 1 else 1)  # each answer's calls under its own span
        for kind in ("input", "output"):  # and its usage is its own calls', not the conversation's
            assert agent.attributes[f"gen_ai.usage.{kind}_tokens"] == sum(
                c.attributes[f"gen_ai.usage.{kind}_tokens"] for c in chats
            )


class _Queues:
    def send(self, task_id: str, priority: Any, **_: Any) -> None:
        pass


def test_a_task_resumed_after_its_budget_ran_out_sends_a_second_invoke_agent_span_of_its_own(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A raised budget reopens an ended task, as a follow-up does: the resumed run's span and the
    end's are another invocation's, not a second copy of the first's."""
    provider = PROVIDERS[0]
    with anthropic_server(monkeypatch) as server:
        server.enqueue(tool_use_reply("lookup", {"query": "q"}, usage=usage_dict(600, 20)))
        task = store.tasks.create(
            submission(provider, constraints={"tools": ["lookup"], "max_tokens": 1300}), tenant="t"
        )
        assert run(store, registry, task.task_id) is TaskStatus.COST_EXCEEDED
        error = store.tasks.get(task.task_id).error
        assert error is not None
        raise_budget(store, _Queues(), task.task_id, add_tokens=100_000)  # type: ignore[arg-type]
        server.enqueue(text_reply("done", usage=usage_dict(900, 6)))
        assert run(store, registry, task.task_id) is TaskStatus.SUCCEEDED
    spans = receiver.spans
    check_tree(spans)
    first, second = invocations(spans, task)
    assert first.attributes["error.type"] == error["code"] and "error.type" not in second.attributes
    assert first.attributes["agentq.invocation"] == 0 and second.attributes["agentq.invocation"] == 1
    assert second.attributes["gen_ai.usage.output_tokens"] == 6


def test_metrics_exporter_none_sends_the_spans_and_no_metric(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For a collector that takes traces only (the SDK's own switch, ``OTEL_METRICS_EXPORTER``)."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    otel.reset()
    with openai_server(monkeypatch) as server:
        server.enqueue(chat_completion("done"))
        task = store.tasks.create(submission(PROVIDERS[1]), tenant="t")
        assert run(store, registry, task.task_id) is TaskStatus.SUCCEEDED
    assert [s.name for s in receiver.spans if s.name.startswith("chat ")] == ["chat gpt-4.1-mini"]
    assert receiver.points == []


class Interrupting:
    """The scripted provider, the task interrupted while its first call is in flight."""

    name = "scripted"

    def __init__(self, store: Storage, task_id: str, submission: TaskSubmission) -> None:
        self.store, self.task_id, self.calls = store, task_id, 0
        self.inner = default_provider_factory(submission)

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.calls += 1
        if self.calls == 1:
            self.store.messages.interrupt(self.task_id)
        return self.inner.complete(request)


def test_an_interrupted_exchange_ends_its_invocation_and_the_next_message_starts_another(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry
) -> None:
    """``idle`` ends an invocation (no error: a person stopped it), so its runs do not hang from a
    span that never arrives, and the message that reopens the task starts the next one."""
    sub = scripted([{"text": "discarded"}, {"text": "answered"}])
    task = store.tasks.create(sub, tenant="t")
    provider = Interrupting(store, task.task_id, sub)
    engine = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=30),
                    providers=lambda _: provider)  # fmt: skip
    assert engine.run(task.task_id, keeper=lambda _: contextlib.nullcontext()).status is TaskStatus.IDLE
    store.messages.accept(task.task_id, "go on")
    assert engine.run(task.task_id, keeper=lambda _: contextlib.nullcontext()).status is TaskStatus.SUCCEEDED
    spans = receiver.spans
    check_tree(spans)
    interrupted, answered = invocations(spans, task)
    assert interrupted.attributes["agentq.status"] == "idle" and interrupted.status_code != 2
    assert "error.type" not in interrupted.attributes
    assert (interrupted.attributes["agentq.invocation"], answered.attributes["agentq.invocation"]) == (0, 1)


def test_the_run_span_says_which_part_of_the_budget_is_known_and_a_counter_the_unknown_by_tenant(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first worker died with a call in flight and its hold's deadline has passed: the run
    that takes the task over counts that hold as spent, its outcome unknown. The run's span
    carries the tree's known and unknown usage, and ``agentq.budget.unknown_tokens`` counts the
    unknown under the tenant (not a GenAI convention: agentq's own, in its namespace)."""
    import time

    provider = PROVIDERS[0]
    with anthropic_server(monkeypatch) as server:
        server.enqueue(text_reply("done", usage=usage_dict(30, 6)))
        task = store.tasks.create(submission(provider, constraints={"max_tokens": 20_000}), tenant="acme")
        claim = store.tasks.claim(task.task_id, "dead", 30)
        assert claim is not None
        store.budgets.reserve(claim[0], task.task_id, 500, 1, until=time.time() - 1)  # its call can no longer end
        store.tasks.release(claim[0])
        assert run(store, registry, task.task_id) is TaskStatus.SUCCEEDED
    otel.reset()  # flushes the metrics
    (span,) = [s for s in receiver.spans if s.name == "run"]
    assert span.attributes["agentq.budget.unknown_tokens"] == 500
    assert span.attributes["agentq.budget.known_tokens"] == 36
    assert span.attributes["agentq.budget.used_tokens"] == 536
    assert receiver.counter("agentq.budget.unknown_tokens") == {(("agentq.tenant", "acme"),): 500}


def test_a_task_s_invocation_and_run_spans_name_its_end_user_by_the_conventions_attribute(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``enduser.id`` as the semantic conventions' registry names it (the ``enduser`` namespace:
    the end user of the system), on the ``invoke_agent`` span and every ``run`` span of a task
    acting for a user, and on neither of a task acting for none."""
    from opentelemetry.semconv._incubating.attributes.enduser_attributes import ENDUSER_ID

    provider = PROVIDERS[0]
    with anthropic_server(monkeypatch) as server:
        for reply in [*provider.replies(), text_reply("done", usage=usage_dict(5, 1))]:
            server.enqueue(reply)
        acting = store.tasks.create(submission(provider, user="auth0|alice"), tenant="acme")
        alone = store.tasks.create(submission(provider, constraints={"tools": []}), tenant="acme")
        assert run(store, registry, acting.task_id) is TaskStatus.SUCCEEDED
        assert run(store, registry, alone.task_id) is TaskStatus.SUCCEEDED
    otel.reset()
    mine = [s for s in receiver.spans if s.name in ("run", "invoke_agent agentq")
            and s.attributes.get("agentq.task_id") == acting.task_id]  # fmt: skip
    assert {s.name for s in mine} == {"run", "invoke_agent agentq"}
    assert all(s.attributes[ENDUSER_ID] == "auth0|alice" for s in mine)
    others = [s for s in receiver.spans if s.attributes.get("agentq.task_id") == alone.task_id]
    assert others and all(ENDUSER_ID not in s.attributes for s in others)
