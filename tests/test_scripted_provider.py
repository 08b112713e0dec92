"""The scripted provider: deterministic replies, stable tool ids, usage from the bytes."""

from __future__ import annotations

import pytest

from agentq.core.models import Script
from agentq.core.providers import LLMRequest, ScriptedProvider, load_script
from agentq.core.providers.scripted import builtin_script_names

SCRIPT = Script.model_validate(
    {"turns": [{"text": "a", "tool_calls": [{"name": "lookup", "input": {"query": "q"}}]}, {"text": "the answer"}]}
)


def _req(messages: list, task_id: str = "t1", max_tokens: int = 1000) -> LLMRequest:  # type: ignore[type-arg]
    return LLMRequest(model="m", messages=messages, max_tokens=max_tokens, task_id=task_id)


def test_the_same_conversation_gets_the_same_reply_with_stable_tool_ids() -> None:
    p = ScriptedProvider(SCRIPT)
    first = p.complete(_req([{"role": "user", "content": "go"}]))
    again = p.complete(_req([{"role": "user", "content": "go"}]))
    assert first == again
    assert first.stop_reason == "tool_use" and first.content[1]["id"].startswith("toolu_")
    other_task = p.complete(_req([{"role": "user", "content": "go"}], task_id="t2"))
    assert other_task.content[1]["id"] != first.content[1]["id"]


def test_the_turn_follows_the_number_of_assistant_messages() -> None:
    p = ScriptedProvider(SCRIPT)
    history = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [{"type": "text", "text": "a"}]}]
    reply = p.complete(_req(history))
    assert reply.stop_reason == "end_turn" and reply.content == [{"type": "text", "text": "the answer"}]


def test_usage_grows_with_the_prompt() -> None:
    p = ScriptedProvider(SCRIPT)
    short = p.complete(_req([{"role": "user", "content": "go"}]))
    long = p.complete(_req([{"role": "user", "content": "go " * 1000}]))
    assert long.usage.input_tokens > short.usage.input_tokens + 700
    assert short.usage.output_tokens > 0


def test_a_reply_longer_than_max_tokens_is_cut_like_a_real_model() -> None:
    p = ScriptedProvider(Script.model_validate({"turns": [{"text": "word " * 500}]}))
    reply = p.complete(_req([{"role": "user", "content": "go"}], max_tokens=10))
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 10


def test_built_in_scripts_load_and_unknown_ones_are_named() -> None:
    assert "research" in builtin_script_names()
    assert len(load_script("research").turns) == 8
    with pytest.raises(ValueError, match="unknown script 'nope'; built-in scripts: first_task, research"):
        load_script("nope")
