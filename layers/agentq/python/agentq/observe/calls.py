"""What the engine reports about each LLM call and each tool call: one subsegment with the
OpenTelemetry GenAI attributes, and the metrics that call produces.

Subsegment names follow the GenAI span names (``chat <model>``, ``execute_tool <tool>``).
Annotations (indexed, ``[A-Za-z0-9_]`` keys) carry the same attributes with dots turned into
underscores: ``gen_ai_request_model``, ``gen_ai_usage_input_tokens``,
``gen_ai_usage_output_tokens``, ``gen_ai_response_finish_reasons``, ``gen_ai_tool_name``, plus
``task_id`` and ``step`` to find a task's calls. Metadata keeps the dotted names.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentq.observe import emf, otel
from agentq.observe.names import UNREGISTERED_TOOL
from agentq.observe.tracing import Span, span

if TYPE_CHECKING:
    from agentq.core.providers.base import LLMResponse

# agentq provider name -> gen_ai.provider.name (OpenTelemetry's well-known values)
GENAI_PROVIDERS = {"anthropic": "anthropic", "bedrock": "aws.bedrock", "bedrock-converse": "aws.bedrock",
                   "openai": "openai"}  # fmt: skip


@dataclass
class LLMCall:
    span: Span
    model: str
    otel_span: Any = None  # the OpenTelemetry span, where OTLP export is on (observe.otel)

    def answered(self, response: LLMResponse) -> None:
        """The provider answered: its usage goes on the subsegment and into the token metrics."""
        usage = response.usage
        tokens_in = usage.input_total
        model = response.model or self.model
        self.span.annotate(
            gen_ai_response_model=model,
            gen_ai_usage_input_tokens=tokens_in,
            gen_ai_usage_output_tokens=usage.output_tokens,
            gen_ai_response_finish_reasons=response.stop_reason,
            attempts=response.attempts,
        )
        attributes = {
            "gen_ai.response.model": model,
            "gen_ai.response.finish_reasons": [response.stop_reason] if response.stop_reason else None,
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
def llm_call(*, provider: str, model: str, max_tokens: int, task_id: str, step: int) -> Iterator[LLMCall]:
    """Around ``provider.complete``; call ``answered`` with the response. A provider error
    leaving the block is recorded on the subsegment."""
    system = GENAI_PROVIDERS.get(provider, provider)
    request: dict[str, str | int] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": system,
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_tokens,
    }
    with span(f"chat {model}") as s, otel.span(f"chat {model}", request) as exported:
        s.annotate(
            gen_ai_operation_name="chat",
            gen_ai_provider_name=system,
            gen_ai_request_model=model,
            task_id=task_id,
            step=step,
        )
        s.describe(request)
        yield LLMCall(s, model, exported)


@dataclass
class ToolCall:
    span: Span
    tool: str  # the registered name, or UNREGISTERED_TOOL
    otel_span: Any = None

    def finished(self, status: str, is_error: bool) -> None:
        self.span.annotate(tool_status=status, tool_error=is_error)
        if self.otel_span is not None:
            self.otel_span.set_attributes({"agentq.tool_status": status, "agentq.tool_error": is_error})
        if is_error:
            emf.record_tool_error(self.tool)


@contextmanager
def tool_call(name: str, *, registered: bool, call_id: str, task_id: str, step: int) -> Iterator[ToolCall]:
    """Around one tool execution; call ``finished`` with its status. A name the model made
    up is reported as ``unregistered`` (metrics, subsegment name, annotations), so what the
    model writes cannot mint metric series; metadata keeps what it asked for."""
    tool = name if registered else UNREGISTERED_TOOL
    described = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name[:200],
        "gen_ai.tool.call.id": call_id,
    }
    with span(f"execute_tool {tool}") as s, otel.span(f"execute_tool {tool}", described) as exported:
        s.annotate(gen_ai_operation_name="execute_tool", gen_ai_tool_name=tool, task_id=task_id, step=step)
        s.describe(described)
        yield ToolCall(s, tool, exported)
