"""Prompt caching for the Messages API (Anthropic and Bedrock): where the breakpoints go.

A long agent re-sends its whole conversation every turn; with ``cache_control`` breakpoints
the provider bills the prefix it has seen within the TTL at a tenth of the input price (and
a write at 1.25x, 2x for the one-hour TTL). The API allows four breakpoints; they go on:

1. the last tool definition (tools are rendered first, so this caches all of them),
2. the system prompt,
3. the last block of the latest message (the rolling one: what the next turn reads back),
4. the last block of the message before it, so a turn whose newest breakpoint moved past the
   API's lookback still finds the previous prefix.

The request is copied, never changed in place: the messages are the engine's checkpointed
conversation, and a stored step must not depend on how it was last sent.

``ttl="1h"`` where the task may wait more than five minutes before its next call (a person's
approval, sub-agents, a slow tool): a five-minute entry would have expired by then. Bedrock
takes the five-minute TTL only, so its requests never name one. ``AGENTQ_PROMPT_CACHE=off``
sends no breakpoints at all.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Literal

CacheTtl = Literal["5m", "1h"]
MAX_BREAKPOINTS = 4


def enabled() -> bool:
    return os.environ.get("AGENTQ_PROMPT_CACHE", "on").strip().lower() not in ("off", "0", "false", "no")


def cached_request(kwargs: dict[str, Any], ttl: CacheTtl | None) -> dict[str, Any]:
    """``kwargs`` of ``messages.create`` with breakpoints added (a copy). ``ttl=None``: the
    API's default TTL, named nowhere (what Bedrock accepts)."""
    control: dict[str, Any] = {"type": "ephemeral"}
    if ttl == "1h":
        control["ttl"] = "1h"
    out = dict(kwargs)
    used = 0
    if out.get("tools"):
        tools = [dict(t) for t in out["tools"]]
        tools[-1]["cache_control"] = dict(control)
        out["tools"] = tools
        used += 1
    if out.get("system"):
        system = out["system"]
        blocks: list[dict[str, Any]] = (
            [{"type": "text", "text": system}] if isinstance(system, str) else copy.deepcopy(system)
        )
        blocks[-1]["cache_control"] = dict(control)
        out["system"] = blocks
        used += 1
    messages = copy.deepcopy(out.get("messages") or [])
    for message in reversed(messages):
        if used >= MAX_BREAKPOINTS:
            break
        content = message.get("content")
        if isinstance(content, str):
            message["content"] = content = [{"type": "text", "text": content}]
        if not content:
            continue
        last = content[-1]
        if last.get("type") in ("thinking", "redacted_thinking"):
            continue  # the API refuses cache_control on thinking blocks
        last["cache_control"] = dict(control)
        used += 1
        if sum(1 for m in messages if _marked(m)) >= 2:
            break
    out["messages"] = messages
    return out


def _marked(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any("cache_control" in block for block in content)
