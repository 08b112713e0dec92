"""Extended thinking per task: the real ``anthropic`` SDK asks for it, thinking blocks (their
signatures, and redacted ones) are checkpointed in the step and sent back unchanged within the
tool-use loop, as the API requires; their tokens are output tokens in the ledger; a thinking
budget that cannot fit in the output limit is refused at submission. The engine and the SDK
against tests/fake_messages_api.py, on the in-memory twin of the table (no AWS semantics here)."""

from __future__ import annotations

import pytest

from agentq.control.submit import parse_submission
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ValidationError
from agentq.core.models import LLMStep, TaskStatus
from agentq.core.providers.anthropic_provider import AnthropicProvider
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_messages_api import FakeMessagesAPI, message_reply, text_reply, usage_dict
from tests.helpers import live_texts_while_it_runs

THINKING = {
    "type": "thinking",
    "thinking": "The user wants the price; look it up first.",
    "signature": "sig-EqQBCgIYAh",
}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}


# The engine's own behaviour needs no AWS. ``store`` and ``registry`` (tests/conftest.py) are the in-memory twin's;
# tests that race processes or use queues ask for ``settings`` and build their own.
STORAGE = "memory"


def _submission(**constraints: object) -> dict[str, object]:
    return {"goal": "what does sku 7 cost?", "provider": "anthropic", "model": "claude-sonnet-4-6",
            "constraints": {"tools": ["lookup"], "max_output_tokens": 4096, **constraints}}  # fmt: skip


def test_thinking_blocks_are_checkpointed_and_sent_back_unchanged(store: Storage, registry: ToolRegistry) -> None:
    use = {"type": "tool_use", "id": "toolu_think_1", "name": "lookup", "input": {"query": "sku 7"}}
    with FakeMessagesAPI() as api:
        api.enqueue(
            message_reply([THINKING, REDACTED, {"type": "text", "text": "Looking it up."}, use], stop_reason="tool_use",
                          usage=usage_dict(input_tokens=50, output_tokens=700)),
            text_reply("It costs 7 euros.", usage=usage_dict(input_tokens=90, output_tokens=20)),
        )  # fmt: skip
        task = store.tasks.create(parse_submission(_submission(thinking_budget_tokens=2048, effort="high")), tenant="t")
        engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30),
                        providers=lambda _: AnthropicProvider(api_key="k", base_url=api.base_url))  # fmt: skip
        assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
        first, second = (r.body for r in api.requests)
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048} and first["max_tokens"] == 4096
    assert first["output_config"] == {"effort": "high"}
    replayed = [{k: v for k, v in b.items() if k != "cache_control"} for b in second["messages"][1]["content"]]
    assert replayed[:2] == [THINKING, REDACTED]  # exactly as the API returned them, signature included
    [llm, _, _] = store.steps.load(task.task_id)
    assert isinstance(llm.body, LLMStep) and llm.body.content[:2] == [THINKING, REDACTED]
    assert store.tasks.get(task.task_id).result == "It costs 7 euros."  # thinking is not the answer
    budget = store.budgets.get(task.task_id)
    assert budget.used == 50 + 700 + 90 + 20  # thinking is billed as output, and counted


def test_a_thinking_budget_that_does_not_fit_the_output_limit_is_refused() -> None:
    with pytest.raises(ValidationError) as refused:
        parse_submission(_submission(thinking_budget_tokens=4096))
    assert refused.value.field == "constraints.thinking_budget_tokens"
    with pytest.raises(ValidationError) as small:
        parse_submission(_submission(thinking_budget_tokens=100))
    assert small.value.field == "constraints.thinking_budget_tokens"
    with pytest.raises(ValidationError) as effort:
        parse_submission(_submission(effort="extreme"))
    assert effort.value.field == "constraints.effort"


def test_a_long_output_is_streamed_and_assembled_into_the_same_step(store: Storage, registry: ToolRegistry) -> None:
    """Past AGENTQ_STREAM_ABOVE_TOKENS (8,192) of output the SDK streams the call (server-sent
    events, thinking deltas and signature included) and the step is what a plain call gives."""
    use = {"type": "tool_use", "id": "toolu_long_1", "name": "lookup", "input": {"query": "sku 9"}}
    with FakeMessagesAPI() as api:
        api.enqueue(
            message_reply([THINKING, {"type": "text", "text": "Looking sku 9 up now."}, use], stop_reason="tool_use",
                          usage=usage_dict(input_tokens=40, output_tokens=900)),
            text_reply("It costs 9 euros, as the catalogue says.", usage=usage_dict(input_tokens=80, output_tokens=30)),
        )  # fmt: skip
        body = _submission(thinking_budget_tokens=16_000, max_output_tokens=32_000)
        task = store.tasks.create(parse_submission(body), tenant="t")
        engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30),
                        providers=lambda _: AnthropicProvider(api_key="k", base_url=api.base_url))  # fmt: skip
        assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
        assert all(r.body["stream"] is True for r in api.requests)
    [llm, _, answer] = store.steps.load(task.task_id)
    assert isinstance(llm.body, LLMStep) and llm.body.content == [
        THINKING,
        {"type": "text", "text": "Looking sku 9 up now."},
        use,
    ]
    assert llm.body.usage.output_tokens == 900 and llm.body.usage.input_tokens == 40
    assert store.tasks.get(task.task_id).result == "It costs 9 euros, as the catalogue says."
    assert isinstance(answer.body, LLMStep) and answer.body.stop_reason == "end_turn"


def test_the_text_of_a_streamed_call_in_flight_rides_on_the_heartbeat_and_is_gone_once_committed(
    store: Storage, registry: ToolRegistry
) -> None:
    """What `agentq watch` shows as "writing": best effort, from the lease heartbeat's own write."""
    import dataclasses

    text = "First the catalogue. Then the price list. Finally the answer: 9 euros."
    with FakeMessagesAPI() as api:
        api.enqueue(dataclasses.replace(text_reply(text), stream_pause_seconds=1.2))
        body = _submission(max_output_tokens=32_000)
        task = store.tasks.create(parse_submission(body), tenant="t")
        engine = Engine(store, worker_id="w", tools=registry,
                        config=EngineConfig(lease_seconds=3, heartbeat_seconds=0.3),
                        providers=lambda _: AnthropicProvider(api_key="k", base_url=api.base_url))  # fmt: skip
        seen = live_texts_while_it_runs(store, engine, task.task_id)
    assert any(text.startswith(s) and s != text for s in seen), seen  # a part, while it was being written
    final = store.tasks.get(task.task_id)
    assert final.result == text and final.live_text is None
