"""The request of the next LLM call, built from the session: what it sends (the conversation,
with old tool results cleared past the context threshold, or a compaction), its tools, and the
estimate its budget hold is sized on. Deterministic in the committed steps, so a resumed worker
sends the request the crashed one would have sent (and hits the same prompt cache)."""

from __future__ import annotations

from typing import Any, Literal

from agentq.core.approval import APPROVAL_TOOL
from agentq.core.context import (
    COMPACT_MAX_TOKENS,
    cleared,
    compaction_messages,
    context_window,
    recall_tool,
    tool_results,
)
from agentq.core.engine._session import Session
from agentq.core.engine.conversation import estimate_input_tokens, offered_tools, task_tools
from agentq.core.fanout import SPAWN_TOOL
from agentq.core.models import ASKS, CompactStep, Constraints, LLMStep, TaskSubmission
from agentq.core.output import INSTRUCTION as OUTPUT_INSTRUCTION
from agentq.core.output import final_answer_tool
from agentq.core.providers import LLMRequest
from agentq.core.remote_agents import remote_tool_specs
from agentq.core.secrets import Secrets, SecretSource
from agentq.core.tools import ToolRegistry
from agentq.core.tools.mcp import McpServers, mcp_tool_specs
from agentq.core.tools.memory import memory_tools

# Native compaction: a request this close to the trigger may be compacted by the server first;
# the summary that call writes is held at this many output tokens.
NATIVE_TRIGGER_MARGIN = 0.8
NATIVE_SUMMARY_TOKENS = 16_384


class RequestBuilder:
    def __init__(self, tools: ToolRegistry, secrets: SecretSource, mcp: McpServers | None) -> None:
        self.tools = tools
        self.secrets = secrets
        self._mcp = mcp

    def registry(self, s: Session) -> ToolRegistry:
        """The tools of this task: the worker's, plus the MCP tools and remote agents its agent version names."""
        if s.tools is None:
            pins = s.task.submission.mcp_tools
            if pins and self._mcp is None:
                self._mcp = McpServers.from_env(secrets=self.secrets if isinstance(self.secrets, Secrets) else None)
            extra = mcp_tool_specs(pins, self._mcp) if pins else []
            schema = s.task.submission.output_schema
            if schema is not None:
                extra.append(final_answer_tool(schema))
            extra += memory_tools(s.task.submission.memory)
            extra += remote_tool_specs(s.task.submission.remote_agents)
            s.tools = self.tools.with_tools(extra)
        return s.tools

    def context(self, s: Session) -> tuple[list[dict[str, Any]], int, bool]:
        """The messages the next call sends, how many tool results they clear, and whether the
        call must be a compaction (``core.context``): the previous call's boundary, moved up to
        all but the latest ``keep_tool_results`` when the request would pass the threshold of
        the model's window; a compaction when it still would, and a turn was taken since the
        last one (a summary that is itself over the threshold is not summarised again)."""
        if s.context is not None and s.context[0] == s.next_step:
            return s.context[1], s.context[2], s.context[3]
        sub = s.task.submission
        last = None
        for record in reversed(s.steps):
            if isinstance(record.body, CompactStep):
                break  # tool results are counted from the compaction on
            if isinstance(record.body, LLMStep):
                last = record.body
                break
        boundary = last.cleared_before if last is not None else 0
        messages = cleared(s.messages, boundary)
        limit = context_window(sub.model) * sub.constraints.context_threshold
        compact = False
        if sub.constraints.compaction != "native" and _estimate(sub.model, sub.system, messages) > limit:
            moved = max(boundary, tool_results(s.messages) - sub.constraints.keep_tool_results)
            if moved > boundary:
                boundary, messages = moved, cleared(s.messages, moved)
            compact = (
                sub.constraints.compaction == "summary"
                and last is not None
                and _estimate(sub.model, sub.system, messages) > limit
            )
        s.context = (s.next_step, messages, boundary, compact)
        return messages, boundary, compact

    def compacting(self, s: Session) -> bool:
        """Whether the next call is a compaction."""
        return self.context(s)[2]

    def max_out(self, s: Session) -> int:
        """The output allowance of the next call: a compaction's summary is kept short."""
        max_out = s.task.submission.constraints.max_output_tokens
        return min(max_out, COMPACT_MAX_TOKENS) if self.compacting(s) else max_out

    def request(self, s: Session, max_tokens: int) -> LLMRequest:
        sub = s.task.submission
        system = sub.system
        if sub.output_schema is not None:
            system = f"{system}\n\n{OUTPUT_INSTRUCTION}" if system else OUTPUT_INSTRUCTION
        messages, boundary, compact = self.context(s)
        tools = self.registry(s).schemas(task_tools(sub))
        if boundary or s.task.compacted_at:
            tools.append(recall_tool().schema())
        thinking = sub.constraints.thinking_budget_tokens
        return LLMRequest(
            compact_at=native_trigger(sub),
            model=sub.model,
            system=system,
            # A compaction sends the turn's own request plus the instruction (the same tools
            # too): its whole prefix is the cached one.
            messages=compaction_messages(messages) if compact else messages,
            tools=tools,
            max_tokens=max_tokens,
            task_id=s.task_id,
            cache_ttl=cache_ttl(sub.constraints),
            effort=None if compact else sub.constraints.effort,
            thinking_budget=thinking if not compact and max_tokens > (thinking or 0) else None,
        )

    def wanted_reservation(self, s: Session) -> tuple[int, int]:
        """(input estimate, full reservation) for the next LLM call."""
        return self.demand(s, estimate_input_tokens(self.request(s, self.max_out(s))))

    def demand(self, s: Session, est_in: int) -> tuple[int, int]:
        """(input, full reservation) of the next LLM call taken to read ``est_in`` tokens: its
        estimate, or more where its provider counted more (``_input_count``)."""
        max_out, compact_at = self.max_out(s), native_trigger(s.task.submission)
        if compact_at and est_in >= compact_at * NATIVE_TRIGGER_MARGIN:
            # The server may compact first: a call of its own that reads the context and writes
            # a summary, billed with this one. Its hold covers that too, so used <= cap holds.
            return est_in, est_in + max_out + est_in + NATIVE_SUMMARY_TOKENS
        return est_in, est_in + max_out


def native_trigger(sub: TaskSubmission) -> int | None:
    """The input at which the server compacts a call's conversation first (native compaction)."""
    if sub.constraints.compaction != "native":
        return None
    return int(context_window(sub.model) * sub.constraints.context_threshold)


def _estimate(model: str, system: str | None, messages: list[dict[str, Any]]) -> int:
    return estimate_input_tokens(LLMRequest(model=model, system=system, messages=messages, tools=[], max_tokens=1))


def cache_ttl(constraints: Constraints) -> Literal["5m", "1h"]:
    """The prompt cache's TTL for a task's calls: an hour where it may wait longer than five
    minutes between two calls (a person's approval, sub-agents), so the wait does not cost a
    full re-read of the conversation; else five minutes (a cheaper write)."""
    offered = offered_tools(constraints)
    pauses = APPROVAL_TOOL in offered or SPAWN_TOOL in offered
    asks = any(policy in ASKS for name, policy in constraints.tool_policies.items() if name in offered)
    return "1h" if pauses or asks else "5m"
