"""What the CLI draws from the API's models, for the states that used to read wrong: a
compaction call in the trace, a retry whose next try has come, an agent's MCP tools, a trace
whose transitions came between a claim's steps."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console

from agentq.api.models import AgentVersion, LLMCallEvent, RetryView, ToolCallEvent, TransitionEvent
from agentq.cli.catalogue import agent_block
from agentq.cli.views import event_line, retry_line, trace_tree


def _llm_call(**fields: Any) -> LLMCallEvent:
    base: dict[str, Any] = {
        "at": 1_000.5, "step": 7, "epoch": 1, "model": "claude-sonnet-4-6", "started_at": 1_000.0,
        "duration_ms": 500, "tokens": {"input": 9_000, "output": 300, "cache_creation": 0, "cache_read": 0, "total": 9_300}, "reserved_tokens": 12_000,
        "cost_usd": "0.031500", "stop_reason": "end_turn", "attempts": 1, "text": "", "tool_calls": [],
        "orphan": False, "truncated": False,
    }  # fmt: skip
    return LLMCallEvent.model_validate(base | fields)


def test_a_compaction_call_reads_as_a_compaction_not_as_the_answer() -> None:
    compaction = event_line(_llm_call(purpose="compaction", text="Summary of 6 turns"), origin=1_000.0).plain
    assert "→ compaction: the conversation goes on from its summary" in compaction
    assert "answer" not in compaction
    answer = event_line(_llm_call(text="the answer"), origin=1_000.0).plain
    assert answer.endswith("→ answer")
    tools = event_line(_llm_call(stop_reason="tool_use", tool_calls=["lookup"]), origin=1_000.0).plain
    assert tools.endswith("→ lookup")


def test_a_retry_whose_next_try_has_come_says_due_now_never_a_time_ago() -> None:
    retry = RetryView(
        scope="delivery", attempt=2, max_attempts=5, error={"code": "overloaded", "status_code": 529, "message": "busy"},
        failed_at=1_000.0, next_attempt_at=1_010.0,
    )  # fmt: skip
    assert retry_line(retry, now=1_007.5).endswith("next try 1970-01-01 00:16:50Z (in 2.50 s)")
    assert retry_line(retry, now=1_010.0).endswith("next try 1970-01-01 00:16:50Z (due now)")
    assert retry_line(retry, now=4_000.0).endswith("(due now)")
    assert retry_line(retry).endswith("next try 1970-01-01 00:16:50Z")  # the trace: no clock, no countdown


def test_agents_show_lists_the_mcp_servers_and_the_tools_pinned_from_each() -> None:
    def pin(server: str, name: str, read_only: bool) -> dict[str, Any]:
        schema = {"type": "object", "properties": {}}
        return {"server": server, "name": name, "description": f"{name} of {server}", "input_schema": schema,
                "read_only": read_only}  # fmt: skip

    agent = AgentVersion.model_validate(
        {
            "name": "billing", "version": 3, "created_at": 0.0, "ref": "billing@3", "model": "claude-sonnet-4-6",
            "tools": ["note_read"], "tool_policies": {"mcp__billing__create_invoice": "ask"},
            "mcp_servers": [{"name": "billing", "tools": ["create_invoice", "get_invoice"]}, {"name": "docs"}],
            "mcp_tools": [pin("billing", "create_invoice", False), pin("billing", "get_invoice", True),
                          pin("docs", "search", True)],
        }
    )  # fmt: skip
    lines = agent_block(agent)
    assert "  tools: note_read" in lines
    assert "  mcp server billing (only create_invoice, get_invoice): 2 tool(s) pinned" in lines
    assert "    mcp__billing__create_invoice (ask)  runs at most once  create_invoice of billing" in lines
    assert "    mcp__billing__get_invoice  read-only  get_invoice of billing" in lines
    assert "  mcp server docs (all its tools): 1 tool(s) pinned" in lines
    assert "    mcp__docs__search  read-only  search of docs" in lines


def _tool_call(at: float, step: int) -> ToolCallEvent:
    return ToolCallEvent(
        at=at, step=step, epoch=1, tool_use_id=f"t{step}", name="lookup", input={}, output="ok", is_error=False,
        status="ok", side_effects=False, started_at=at - 0.1, duration_ms=100, truncated=False,
    )  # fmt: skip


def _transition(at: float, event: str) -> TransitionEvent:
    detail: dict[str, Any] = {}
    if event == "retry_scheduled":
        detail = {"scope": "call", "attempt": 1, "max_attempts": 5, "error": {"code": "overloaded"},
                  "failed_at": at, "next_attempt_at": at + 1}  # fmt: skip
    return TransitionEvent.model_validate({"at": at, "event": event, "worker": "w", "epoch": 1, "detail": detail})


def _drawn_times(events: list[Any]) -> list[float]:
    console = Console(width=240, record=True, color_system=None)
    console.print(trace_tree("t-1", None, events))
    return [float(m) for m in re.findall(r"\+\s*(\d+\.\d\d)s", console.export_text())]


def test_the_trace_tree_reads_in_time_order_wherever_a_transition_falls_between_steps() -> None:
    """A claim's steps nest under it, and a turn's tool calls under its LLM call; a transition
    that came meanwhile (an interrupt asked for, an approval, a retry) is drawn where it happened,
    not after everything the claim did (``+9.70s interrupt asked for`` drawn below ``+40.45s``)."""
    steps: list[Any] = [_transition(1.0, "claimed")]
    for k in range(1, 7, 2):  # a turn at k, its tool call at k + 1, ten seconds apart
        steps += [_llm_call(at=10.0 * k, step=k, started_at=10.0 * k - 1, tool_calls=["lookup"]),
                  _tool_call(10.0 * k + 5, k + 1)]  # fmt: skip
    steps += [_transition(70.0, "claimed"), _llm_call(at=80.0, step=7, started_at=79.0), _transition(90.0, "finished")]
    for kind in ("interrupt_requested", "approval_requested", "retry_scheduled", "approval_decided"):
        for i in range(1, len(steps)):  # the transition at every gap between two lines
            at = (steps[i - 1].at + steps[i].at) / 2
            events = [*steps[:i], _transition(at, kind), *steps[i:]]
            drawn = _drawn_times(events)
            assert len(drawn) == len(events) and drawn == sorted(drawn), (kind, i, drawn)
