"""Context management: a long task's conversation stays inside the model's context window.

The checkpointed steps keep every tool result in full; what is *sent* may clear old ones.
Before each call the engine estimates the request; past ``constraints.context_threshold`` of
the model's window (``context_window``: a table, ``AGENTQ_CONTEXT_WINDOWS`` extends it), every
tool result but the last ``constraints.keep_tool_results`` is replaced by a placeholder that
says what was there and how to get it back: the ``recall`` tool, which reads the result from
the task's own immutable steps, so nothing is lost. The boundary (results before it cleared)
is recorded on the LLM step that was sent with it, so a resumed worker rebuilds exactly the
request the first one sent, and it moves in one jump when the threshold is crossed, not every
turn, so the prompt cache keeps hitting between jumps.

When clearing is not enough (``constraints.compaction == "summary"``), the next call is a
compaction instead: the same request (so the prompt cache still hits) with an instruction to
summarise, committed as its own ``CompactStep``, charged to the budget and shown in the trace
like any call. The conversation then goes on from the goal and that summary alone, and META
records the step (``compacted_at``), so a resumed worker reads the steps from it on, not the
whole history; ``recall`` still reads any earlier result back from the steps.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

from pydantic import Field

from agentq.core.tools import ToolSpec, tool

RECALL_TOOL = "recall"
DEFAULT_WINDOW = 200_000
CONTEXT_WINDOWS: dict[str, int] = {
    "claude-opus-4": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-haiku-4-5": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-3-5-haiku": 200_000,
}


def context_window(model: str) -> int:
    """The model's window in tokens: the longest matching prefix of the table (and of
    ``AGENTQ_CONTEXT_WINDOWS``, a JSON object of the same shape), else 200,000."""
    table = dict(CONTEXT_WINDOWS)
    raw = os.environ.get("AGENTQ_CONTEXT_WINDOWS", "").strip()
    if raw:
        table.update({str(k): int(v) for k, v in json.loads(raw).items()})
    name = model.rsplit("/", maxsplit=1)[-1].split("anthropic.", 1)[-1]
    best = max((k for k in table if name.startswith(k)), key=len, default=None)
    return table[best] if best else DEFAULT_WINDOW


@tool(name=RECALL_TOOL, side_effects=False, timeout_seconds=10)
def recall(
    tool_use_id: Annotated[str, Field(min_length=1, max_length=200, description="the id the placeholder names")],
) -> str:
    """Read back a tool result that was cleared from the conversation to save context."""
    raise RuntimeError("recall is carried out by the agentq engine")


def recall_tool() -> ToolSpec:
    return recall


def tool_results(messages: list[dict[str, Any]]) -> int:
    return sum(
        1 for m in messages if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"] if b.get("type") == "tool_result"
    )  # fmt: skip


def cleared(messages: list[dict[str, Any]], boundary: int) -> list[dict[str, Any]]:
    """``messages`` with the first ``boundary`` tool results replaced by placeholders (a copy;
    the messages given are not changed)."""
    if boundary <= 0:
        return messages
    names = {
        b["id"]: b.get("name", "a tool")
        for m in messages if m["role"] == "assistant" and isinstance(m["content"], list)
        for b in m["content"] if b.get("type") == "tool_use"
    }  # fmt: skip
    out, seen = [], 0
    for message in messages:
        content = message["content"]
        if message["role"] != "user" or not isinstance(content, list) or seen >= boundary:
            out.append(message)
            continue
        blocks = []
        for block in content:
            if block.get("type") == "tool_result" and seen < boundary:
                seen += 1
                text = block.get("content")
                size = len(text) if isinstance(text, str) else len(json.dumps(text))
                use_id = block["tool_use_id"]
                blocks.append({
                    **block,
                    "content": f"[cleared to save context: {names.get(use_id, 'a tool')} returned "
                    f"{size} characters here; recall(tool_use_id={use_id!r}) reads them back]",
                })  # fmt: skip
                continue
            blocks.append(block)
        out.append({**message, "content": blocks})
    return out


COMPACT_MAX_TOKENS = 4096
COMPACT_INSTRUCTION = (
    "The conversation is about to pass the context window. Do not call a tool now: reply with a summary "
    "that lets you carry on the task from it alone. Keep what the goal still needs: what is done and how "
    "(tool calls that changed something, with their results, so they are never repeated), facts and numbers "
    "found, decisions made and why, what is left to do and the next step. Name the tool_use_id of any tool "
    "result you may need again verbatim: recall(tool_use_id=...) reads it back. Reply with the summary only."
)


def compaction_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the instruction to summarise added to the last (user) message, so the
    request shares its whole prefix with the turn it replaces (a copy)."""
    *head, last = messages
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return [*head, {**last, "content": [*blocks, {"type": "text", "text": COMPACT_INSTRUCTION}]}]


def resumed_goal(goal: str, summary: str) -> str:
    """The first message of a compacted conversation: the goal, then the summary of the work."""
    return (
        f"{goal}\n\n<summary_of_work_so_far>\n{summary}\n</summary_of_work_so_far>\n"
        "The conversation so far was compacted into the summary above. Continue the task from it."
    )
