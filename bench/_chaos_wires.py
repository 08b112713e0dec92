"""The chaos model on the other providers' wires: the same plans, faults and usage ledger whether
a task's provider is ``anthropic`` (the Messages API, bench/chaos.py's own), ``openai`` (Chat
Completions) or ``bedrock-converse`` (Converse), so a mixed fleet is held to the same invariants.

A request is read back into Messages API turns (what the plans are written against: the goal
first, one text block per person's message, one assistant turn per model turn), and a turn the
model plays is written out in the wire's shape with the plan's own tool-call ids (the side-effect
ledger is keyed by them) and its usage; a fault becomes the wire's own: a 429 with retry-after,
a 503, a 500, a dropped connection, a 200 that is not JSON, a slow reply (a reply cut midway
and a stall, which only the Messages API's server plays, are a dropped connection here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fake_model_servers import FakeReply, chat_completion, chat_error, converse_error, converse_reply


@dataclass(frozen=True)
class Turn:
    """What the model does with one request: a fault (then nothing else matters), or content
    blocks in Messages API shape and their usage; ``slow``: seconds a slow reply waits."""

    fault: str | None
    slow: float = 0.0
    content: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0


# --- requests back into Messages API turns ----------------------------------------------------


def chat_turns(body: Any) -> list[dict[str, Any]]:
    """Chat Completions messages as Messages turns. The provider joins a user turn's text blocks
    with a blank line (openai_provider._chat_messages); the chaos texts hold none, so splitting on
    it gives the blocks back."""
    turns: list[dict[str, Any]] = []
    for m in body.get("messages") or [] if isinstance(body, dict) else []:
        if m.get("role") == "user":
            texts = str(m.get("content") or "").split("\n\n")
            turns.append({"role": "user", "content": [{"type": "text", "text": t} for t in texts]})
        elif m.get("role") == "tool":
            turns.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.get("tool_call_id")}]})
        elif m.get("role") == "assistant":
            turns.append({"role": "assistant", "content": []})
    return turns


def converse_turns(body: Any) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for m in body.get("messages") or [] if isinstance(body, dict) else []:
        blocks = [
            {"type": "text", "text": b["text"]} if "text" in b else {"type": "tool_result"}
            for b in m.get("content") or []
            if "text" in b or "toolResult" in b
        ]
        turns.append({"role": m.get("role"), "content": blocks})
    return turns


# --- turns out in the wire's shape --------------------------------------------------------------


def chat_reply(turn: Turn) -> FakeReply:
    return _played(
        turn,
        _chat_fault,
        lambda text, calls: chat_completion(text, calls, prompt_tokens=turn.input_tokens,
                                            completion_tokens=turn.output_tokens),
        lambda reply: reply.body["choices"][0]["message"].get("tool_calls") or [],
        id_key="id",
    )  # fmt: skip


def converse_reply_of(turn: Turn) -> FakeReply:
    return _played(
        turn,
        _converse_fault,
        lambda text, calls: converse_reply(text, calls, input_tokens=turn.input_tokens,
                                           output_tokens=turn.output_tokens),
        lambda reply: [b["toolUse"] for b in reply.body["output"]["message"]["content"] if "toolUse" in b],
        id_key="toolUseId",
    )  # fmt: skip


def _played(
    turn: Turn,
    fault_of: Callable[[str | None], FakeReply | None],
    reply_of: Callable[[str | None, list[tuple[str, Any]]], FakeReply],
    tool_calls_of: Callable[[FakeReply], list[dict[str, Any]]],
    *,
    id_key: str,
) -> FakeReply:
    """``turn`` on one wire: its fault in the wire's shape, or its text and tool calls in the
    wire's reply (``reply_of``), each call given the plan's own id (``id_key`` of each of
    ``tool_calls_of(reply)``, in order: the side-effect ledger is keyed by them), slowed by
    ``turn.slow``."""
    fault = fault_of(turn.fault)
    if fault is not None:
        return fault
    text = "".join(b["text"] for b in turn.content if b["type"] == "text") or None
    uses = [b for b in turn.content if b["type"] == "tool_use"]
    reply = reply_of(text, [(b["name"], b["input"]) for b in uses])
    for call, use in zip(tool_calls_of(reply), uses, strict=True):
        call[id_key] = use["id"]
    return dataclasses.replace(reply, delay_seconds=turn.slow)


def delivered_usage(reply: FakeReply) -> tuple[int, int]:
    """The input and output tokens a 2xx reply of either wire bills (0, 0 for one that is not a
    reply)."""
    usage = reply.body.get("usage") if isinstance(reply.body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    if "prompt_tokens" in usage:
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    return int(usage["inputTokens"]), int(usage["outputTokens"])


NOT_JSON = b'{"choices": [ this is not JSON'


def _chat_fault(kind: str | None) -> FakeReply | None:
    return {
        "429": chat_error(429, "rate_limit_error", "chaos: slow down", {"retry-after": "0.2"}),
        "529": chat_error(503, "server_error", "chaos: overloaded"),
        "500": chat_error(500, "server_error", "chaos: internal error"),
        "reset": FakeReply(0, reset=True),
        "cut": FakeReply(0, reset=True),  # these wires' servers cut no reply midway: a reset instead
        "stall": FakeReply(0, reset=True),
        "malformed": FakeReply(200, raw=NOT_JSON),
    }.get(kind or "")


def _converse_fault(kind: str | None) -> FakeReply | None:
    return {
        "429": converse_error(429, "ThrottlingException", "chaos: too many tokens", {"retry-after": "0.2"}),
        "529": converse_error(503, "ServiceUnavailableException", "chaos: overloaded"),
        "500": converse_error(500, "InternalServerException", "chaos: internal error"),
        "reset": FakeReply(0, reset=True),
        "cut": FakeReply(0, reset=True),  # these wires' servers cut no reply midway: a reset instead
        "stall": FakeReply(0, reset=True),
        "malformed": FakeReply(200, raw=NOT_JSON),
    }.get(kind or "")
