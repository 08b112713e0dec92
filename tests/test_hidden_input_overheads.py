"""A call's hold covers the input the provider bills that its request does not show: Anthropic
adds a tool-use system prompt to every request that offers tools (346 tokens for the Claude 4
family, up to 530 for Claude 3 Opus: docs "Tool use pricing and tokens"), billed as input, and
Claude on Bedrock bills the same. Near the cap a call's output allowance shrinks to what the
hold leaves past its input estimate; a model that writes all of it is billed that allowance, so
an estimate short of the billed input put ``used`` past ``cap`` by the difference (ARCHITECTURE
4). The estimate counts the hidden prompt (``providers.hidden_input``).

The engine is real, and so is the ``anthropic`` SDK, against the fake Messages API billing as
the API does (``tests/prompt_cache_server.py``: the request's blocks, four characters a token)
and, asked to, the hidden tool prompt (``FakeMessagesAPI(bills_tool_prompt=True)``)."""

from __future__ import annotations

from typing import Any

import pytest

from agentq.control.submit import parse_submission
from agentq.core.engine import Engine, EngineConfig
from agentq.core.engine.conversation import estimate_input_tokens
from agentq.core.models import LLMStep
from agentq.core.providers import LLMRequest
from agentq.core.providers.hidden_input import TOOL_PROMPT_TOKENS
from agentq.core.tools import ToolRegistry, tool
from agentq.storage.container import memory_storage

from tests.fake_messages_api import TOOL_PROMPT_TOKENS as PUBLISHED
from tests.fake_messages_api import TOOL_PROMPT_TOKENS_LATER, FakeMessagesAPI, point_anthropic_at, tool_prompt_tokens
from tests.helpers import wait_for
from tests.prompt_cache_server import CacheAccounting, responder

STORAGE = "memory"
MAX_OUT = 400


@tool(name="lookup")
def lookup(query: str) -> str:
    """Look a word up."""
    return f"{query}: found"


def _plan(body: dict[str, Any]) -> tuple[list[dict[str, Any]], str, int]:
    """Two lookups, then an answer; a call whose allowance the cap shrank writes all of it (a
    model that had more to say, cut at ``max_tokens``)."""
    allowed = int(body["max_tokens"])
    if allowed < MAX_OUT:
        return [{"type": "text", "text": "w" * (4 * allowed)}], "max_tokens", allowed
    done = sum(1 for m in body["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result")  # fmt: skip
    if done >= 2:
        return [{"type": "text", "text": "two found"}], "end_turn", 3
    use = {"type": "tool_use", "id": f"toolu_{done + 1:03d}", "name": "lookup", "input": {"query": f"q{done}"}}
    return [{"type": "text", "text": "looking"}, use], "tool_use", 20


def test_a_call_near_the_cap_that_writes_its_whole_allowance_stays_under_the_cap_with_the_hidden_tool_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At every cap from none of the answering call's hold to all of it, ``used <= cap``, and
    the ledger charged exactly what the server billed. Before, 16 of the 25 caps ended over,
    by 260 to 285 tokens: a cap of 1,211 at 1,471 used, its answering call's estimate of 265
    tokens holding for a request billed 525 (179 of its blocks, 346 of the hidden prompt)."""
    with FakeMessagesAPI(responder=responder(CacheAccounting(), _plan), bills_tool_prompt=True) as api:
        point_anthropic_at(api, monkeypatch.setenv)

        def run(cap: int) -> tuple[Any, list[LLMStep]]:
            store = memory_storage()
            body = {"goal": "look two words up", "provider": "anthropic", "model": "claude-sonnet-4-6",
                    "constraints": {"tools": ["lookup"], "max_steps": 20, "max_output_tokens": MAX_OUT,
                                    "max_tokens": cap}}  # fmt: skip
            task = store.tasks.create(parse_submission(body), tenant="t")
            engine = Engine(store, worker_id="w", tools=ToolRegistry([lookup]), config=EngineConfig(lease_seconds=30))
            engine.run(task.task_id)
            steps = [r.body for r in store.steps.load(task.task_id) if isinstance(r.body, LLMStep)]
            wait_for(lambda: len(api.delivered_usage) == len(steps), what="the server's record of every reply")
            billed = sum(int(u["input_tokens"]) + int(u["output_tokens"]) for u in api.delivered_usage)
            api.delivered_usage.clear()
            budget = store.budgets.get(task.task_id)
            assert budget.used == billed and budget.reserved == 0, (cap, budget, billed)
            return budget, steps

        _, free = run(1_000_000)
        assert [s.stop_reason for s in free] == ["tool_use", "tool_use", "end_turn"]
        before, whole = sum(s.usage.total for s in free[:2]), free[2].reserved_tokens
        shrunk = 0
        for cap in (before + whole * j // 24 for j in range(1, 26)):  # none of its hold, to all of it
            budget, steps = run(cap)
            assert budget.used <= budget.cap == cap, (cap, budget)
            shrunk += any(s.stop_reason == "max_tokens" for s in steps)
    assert shrunk > 0  # the answering call went under a shrunk hold, and wrote all of it, at some caps


def test_the_estimate_counts_the_hidden_tool_prompt_above_every_published_figure() -> None:
    """The constant the estimate adds for a request with tools bounds each model's tool-use
    system prompt in the published table (auto and forced tool choice), as the fake server
    bills it; a request with no tools adds nothing."""
    figures = [n for pair in (*PUBLISHED.values(), TOOL_PROMPT_TOKENS_LATER) for n in pair]
    assert max(figures) == 530 and max(figures) <= TOOL_PROMPT_TOKENS
    messages = [{"role": "user", "content": "hi"}]
    spec = {"name": "lookup", "description": "Look a word up.", "input_schema": {"type": "object"}}
    bare = LLMRequest(model="claude-3-opus-20240229", messages=messages, max_tokens=1)
    offered = bare.model_copy(update={"tools": [spec]})
    assert tool_prompt_tokens({"model": bare.model, "tools": [spec]}) == 530
    assert estimate_input_tokens(offered) - estimate_input_tokens(bare) >= TOOL_PROMPT_TOKENS
    assert estimate_input_tokens(bare) < TOOL_PROMPT_TOKENS  # no hidden prompt without tools
