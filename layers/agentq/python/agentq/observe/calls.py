"""What the engine reports about each LLM call and each tool call: one subsegment with the
OpenTelemetry GenAI attributes, and the metrics that call produces.

Subsegment names follow the GenAI span names (``chat <model>``, ``execute_tool <tool>``); where
OTLP export is on, the same calls are OpenTelemetry spans (``observe/otel.py``) and a model call
is a point of each GenAI client metric (``observe/otel_metrics.py``).
Annotations (indexed, ``[A-Za-z0-9_]`` keys) carry the same attributes with dots turned into
underscores: ``gen_ai_request_model``, ``gen_ai_usage_input_tokens``,
``gen_ai_usage_output_tokens``, ``gen_ai_response_finish_reasons``, ``gen_ai_tool_name``, plus
``task_id`` and ``step`` to find a task's calls. Metadata keeps the dotted names.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentq.observe import emf, otel, otel_metrics
from agentq.observe.names import UNREGISTERED_TOOL
from agentq.observe.tracing import Span, span

if TYPE_CHECKING:
    from agentq.core.providers.base import LLMResponse


DEFAULT_PORTS = {"https": 443, "http": 80}


def server_of(endpoint: str | None) -> dict[str, str | int]:
    """``server.address`` and ``server.port`` of a provider's base URL (the scheme's port when
    the URL names none); nothing for a provider that calls no server."""
    if not endpoint:
        return {}
    url = urllib.parse.urlsplit(endpoint)
    if not url.hostname:
        return {}
    port = url.port or DEFAULT_PORTS.get(url.scheme)
    return {"server.address": url.hostname, **({"server.port": port} if port else {})}


def error_type(exc: BaseException) -> str:
    """``error.type`` of a failed call: the provider error's code (``overloaded``,
    ``provider_timeout``, ...), else the exception's class."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) and code else type(exc).__qualname__


@dataclass
class LLMCall:
    span: Span
    model: str
    otel_span: Any = None  # the OpenTelemetry span, where OTLP export is on (observe.otel)
    metric: dict[str, str | int] = field(default_factory=dict)  # the GenAI metrics' attributes
    tokens: tuple[int, int] | None = None  # (input, output), once answered

    def answered(self, response: LLMResponse) -> None:
        """The provider answered: its usage goes on the subsegment and into the token metrics."""
        usage = response.usage
        tokens_in = usage.input_total
        model = response.model or self.model
        self.tokens = (tokens_in, usage.output_tokens)
        self.metric["gen_ai.response.model"] = model
        self.span.annotate(
            gen_ai_response_model=model,
            gen_ai_usage_input_tokens=tokens_in,
            gen_ai_usage_output_tokens=usage.output_tokens,
            gen_ai_response_finish_reasons=response.stop_reason,
            attempts=response.attempts,
        )
        # The provider's own finish reason (OpenAI's "stop", not the "end_turn" the engine reads).
        finish = response.finish_reason or response.stop_reason
        attributes = {
            "gen_ai.response.model": model,
            "gen_ai.response.id": response.response_id,
            "gen_ai.response.finish_reasons": [finish] if finish else None,
            "gen_ai.usage.input_tokens": tokens_in,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read_input_tokens,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_creation_input_tokens,
        }
        self.span.describe(attributes)
        if self.otel_span is not None:
            self.otel_span.set_attributes({k: v for k, v in attributes.items() if v is not None})
            self.otel_span.set_attribute("agentq.attempts", response.attempts)
        emf.record_llm_usage(model, usage)


@contextmanager
def llm_call(
    *,
    provider: str,
    model: str,
    max_tokens: int,
    task_id: str,
    step: int,
    endpoint: str | None = None,
    streams: bool = False,
    since: float | None = None,
) -> Iterator[LLMCall]:
    """Around ``provider.complete``; call ``answered`` with the response. A provider error
    leaving the block is recorded on the subsegment, and as ``error.type`` on the span and the
    duration metric. ``endpoint``: the provider's base URL (``server.address``/``server.port``);
    ``streams``: the request goes as a stream (``gen_ai.request.stream``, which the conventions
    set if and only if it does: known before the call, so a call that fails says it too);
    ``since``: when the call went out, if before the block (``time.time()``: a batch's
    submission, its answer read by a later run), where its span starts and its duration counts from."""
    system = otel.genai_provider(provider)
    server = server_of(endpoint)
    metric: dict[str, str | int] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": system,
        "gen_ai.request.model": model,
        **server,
    }
    # The task is the conversation: its follow-ups continue it (ARCHITECTURE 11).
    request: dict[str, str | int] = {
        **metric,
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.conversation.id": task_id,
        **({"gen_ai.request.stream": True} if streams else {}),
    }
    started = time.monotonic() - (max(0.0, time.time() - since) if since is not None else 0.0)
    with (
        span(f"chat {model}") as s,
        otel.span(f"chat {model}", request, client=True, start_time=since) as exported,
    ):
        s.annotate(
            gen_ai_operation_name="chat",
            gen_ai_provider_name=system,
            gen_ai_request_model=model,
            task_id=task_id,
            step=step,
        )
        s.describe(request)
        call = LLMCall(s, model, exported, metric)
        try:
            yield call
        except BaseException as exc:
            kind = error_type(exc)
            if exported is not None:
                exported.set_attribute("error.type", kind)
            otel_metrics.record_call({**metric, "error.type": kind}, time.monotonic() - started, None)
            raise
        otel_metrics.record_call(metric, time.monotonic() - started, call.tokens)


@dataclass
class InputCount:
    span: Span
    otel_span: Any = None

    def counted(self, tokens: int) -> None:
        """The provider counted the request's input at ``tokens`` (billed nothing)."""
        self.span.annotate(agentq_counted_input_tokens=tokens)
        if self.otel_span is not None:
            self.otel_span.set_attribute("agentq.counted_input_tokens", tokens)


@contextmanager
def input_count(
    *, provider: str, model: str, task_id: str, step: int, endpoint: str | None = None
) -> Iterator[InputCount]:
    """Around a provider's count of a call's input before the call (``count_tokens``, asked for
    a call whose hold the cap shrank: ``core.engine._input_count``); call ``counted`` with its
    answer. A span and a subsegment as a model call's (``count_tokens <model>``), a failure on
    them as ``error.type``; no GenAI client metric: it is no model call, and bills nothing."""
    attributes: dict[str, str | int] = {
        "gen_ai.operation.name": "count_tokens",
        "gen_ai.provider.name": otel.genai_provider(provider),
        "gen_ai.request.model": model,
        "gen_ai.conversation.id": task_id,
        **server_of(endpoint),
    }
    with span(f"count_tokens {model}") as s, otel.span(f"count_tokens {model}", attributes, client=True) as exported:
        s.annotate(gen_ai_operation_name="count_tokens", gen_ai_request_model=model, task_id=task_id, step=step)
        s.describe(attributes)
        try:
            yield InputCount(s, exported)
        except BaseException as exc:
            if exported is not None:
                exported.set_attribute("error.type", error_type(exc))
            raise


@dataclass
class ToolCall:
    span: Span
    tool: str  # the registered name, or UNREGISTERED_TOOL
    otel_span: Any = None

    def finished(self, status: str, is_error: bool) -> None:
        self.span.annotate(tool_status=status, tool_error=is_error)
        if self.otel_span is not None:
            self.otel_span.set_attributes({"agentq.tool_status": status, "agentq.tool_error": is_error})
            if is_error:  # the call ended in an error ("error", "timeout"): the conventions' error.type
                otel.failed(self.otel_span, status if status != "ok" else "error")
        if is_error:
            emf.record_tool_error(self.tool)


@contextmanager
def tool_call(
    name: str, *, registered: bool, call_id: str, task_id: str, step: int, description: str | None = None
) -> Iterator[ToolCall]:
    """Around one tool execution; call ``finished`` with its status. A name the model made
    up is reported as ``unregistered`` (metrics, subsegment name, annotations), so what the
    model writes cannot mint metric series; metadata keeps what it asked for."""
    tool = name if registered else UNREGISTERED_TOOL
    described = otel.tool_attributes(name, call_id, description)
    with span(f"execute_tool {tool}") as s, otel.span(f"execute_tool {tool}", described) as exported:
        s.annotate(gen_ai_operation_name="execute_tool", gen_ai_tool_name=tool, task_id=task_id, step=step)
        s.describe(described)
        yield ToolCall(s, tool, exported)
