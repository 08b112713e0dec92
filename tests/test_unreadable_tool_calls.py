"""A reply read whole, its usage with it, whose tool call's input is not a JSON object (cut where
the output limit fell, or JSON the model got wrong) is an answer, not a failed attempt: the ledger
knows what the provider reported (ARCHITECTURE 4: ``known`` is the reported usage whenever a
call's outcome is known), the call is never made (ARCHITECTURE 3: a call that cannot be read has
no effect to keep at most once), and the task ends as Anthropic's cut or malformed turn ends it
(``output_truncated``, ``budget_exceeded`` when the allowance was lowered to fit the budget,
``model_output_malformed``), in one attempt. Before, the OpenAI and ConverseStream providers
raised it as a reply that is not a Message: retried (a cut at the output limit fails the same way
every time), each attempt billed by the provider and its hold counted spent and unknown, and the
task ended ``malformed_response`` (3 replies of 400 in + 64 out: known 0, unknown 2,355).

Through the real SDKs (openai; boto3) against the local Chat Completions and Converse servers,
plain and streamed, the engine on the in-memory store."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_model_servers import (
    FakeChatCompletions,
    FakeConverse,
    FakeReply,
    chat_completion,
    converse_reply,
    event_stream_frame,
    point_boto3_at,
)

STORAGE = "memory"
GPT = "gpt-4.1-mini"
NOVA = "us.amazon.nova-pro-v1:0"
RETRY = json.dumps({"base_delay": 0.0, "max_delay": 0.0, "max_attempts": 3})
CUT = '{"amount_cents": 500, "me'  # where the output limit fell
BAD = '{"amount_cents": 500, memo: m}'  # the model's own bad JSON, whole
BILLED = 400 + 64  # each reply's usage: 400 in, 64 out


def _chat(raw: str, finish: str) -> FakeReply:
    return chat_completion(None, [("charge_card", {})], raw_arguments=raw, finish_reason=finish,
                           prompt_tokens=400, completion_tokens=64)  # fmt: skip


def _converse_stream(raw: str, stop: str) -> FakeReply:
    """A ConverseStream read whole (messageStop, then metadata with the usage), its tool use's
    input JSON text ``raw``."""
    return FakeReply(200, events=[
        event_stream_frame("messageStart", {"role": "assistant"}),
        event_stream_frame("contentBlockStart", {"contentBlockIndex": 0,
                                                 "start": {"toolUse": {"toolUseId": "tooluse_1", "name": "charge_card"}}}),
        event_stream_frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": {"input": raw}}}),
        event_stream_frame("contentBlockStop", {"contentBlockIndex": 0}),
        event_stream_frame("messageStop", {"stopReason": stop}),
        event_stream_frame("metadata", {"usage": {"inputTokens": 400, "outputTokens": 64, "totalTokens": 464},
                                        "metrics": {"latencyMs": 1}}),
    ], content_type="application/vnd.amazon.eventstream")  # fmt: skip


def _converse(tool_input: Any, stop: str) -> FakeReply:
    """A whole Converse reply whose tool use's input is ``tool_input`` (a document that is not an object)."""
    reply = converse_reply(None, [("charge_card", {})], stop_reason=stop, input_tokens=400, output_tokens=64)
    reply.body["output"]["message"]["content"][0]["toolUse"]["input"] = tool_input
    return reply


# (provider, streamed, the reply, the task's error code, the step's stop reason)
UNREADABLE: list[tuple[str, bool, Callable[[], FakeReply], str, str]] = [
    ("openai", False, lambda: _chat(CUT, "length"), "output_truncated", "max_tokens"),
    ("openai", False, lambda: _chat(BAD, "tool_calls"), "model_output_malformed", "malformed_output"),
    ("openai", True, lambda: _chat(CUT, "length"), "output_truncated", "max_tokens"),
    ("openai", True, lambda: _chat(BAD, "tool_calls"), "model_output_malformed", "malformed_output"),
    ("bedrock-converse", True, lambda: _converse_stream(CUT, "max_tokens"), "output_truncated", "max_tokens"),
    ("bedrock-converse", True, lambda: _converse_stream(BAD, "tool_use"), "model_output_malformed", "malformed_output"),
    ("bedrock-converse", False, lambda: _converse("500 cents", "tool_use"), "model_output_malformed", "malformed_output"),
]  # fmt: skip
IDS = ["openai-cut", "openai-bad_json", "openai_stream-cut", "openai_stream-bad_json", "converse_stream-cut",
       "converse_stream-bad_json", "converse-input_not_an_object"]  # fmt: skip


def _run(store: Storage, registry: ToolRegistry, provider: str, **constraints: Any) -> str:
    model = GPT if provider == "openai" else NOVA
    body = {"goal": "charge the card", "provider": provider, "model": model,
            "constraints": {"tools": ["charge_card"], "max_output_tokens": 64, "max_tokens": 20_000, **constraints}}  # fmt: skip
    task_id = store.tasks.create(TaskSubmission.model_validate(body), tenant="t").task_id
    Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5)).run(task_id)
    return task_id


def _serve(provider: str, monkeypatch: pytest.MonkeyPatch, streamed: bool) -> FakeChatCompletions | FakeConverse:
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", RETRY)
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "0" if streamed else "100000")
    if provider == "openai":
        chat = FakeChatCompletions()
        monkeypatch.setenv("OPENAI_BASE_URL", chat.openai_base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        return chat
    converse = FakeConverse()
    point_boto3_at(converse, monkeypatch.setenv)
    return converse


@pytest.mark.parametrize(("provider", "streamed", "reply", "code", "stop"), UNREADABLE, ids=IDS)
def test_a_reply_whose_tool_call_input_does_not_parse_is_charged_its_reported_usage_once_and_ends_the_task(
    store: Storage,
    registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    provider: str,
    streamed: bool,
    reply: Callable[[], FakeReply],
    code: str,
    stop: str,
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    with _serve(provider, monkeypatch, streamed) as server:
        server.enqueue(*[reply() for _ in range(3)])
        task_id = _run(store, registry, provider)
        sent = len(server.requests)
    budget = store.budgets.get(task_id)
    assert (sent, budget.known, budget.unknown, budget.reserved) == (1, BILLED, 0, 0)
    task = store.tasks.get(task_id)
    assert (task.status, (task.error or {}).get("code")) == (TaskStatus.FAILED, code), task.error
    steps = store.steps.load(task_id)
    assert [type(s.body) for s in steps] == [LLMStep], steps  # no tools step: the call was never made
    step = steps[0].body
    assert isinstance(step, LLMStep) and step.stop_reason == stop and step.tool_uses() == []
    assert not any(b.get("type") == "tool_use" for b in step.content), step.content
    assert not ledger.exists()  # charge_card never ran


def test_a_cut_tool_call_under_an_allowance_lowered_to_fit_the_budget_ends_the_task_cost_exceeded_as_anthropics_does(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``turn_end``: a turn cut at an output limit that was lowered to what was left of the budget
    is the budget running out, not a limit to raise. OpenAI's ``length`` mid tool call ends the
    same way, charged what it reported."""
    with _serve("openai", monkeypatch, streamed=False) as server:
        server.enqueue(*[_chat(CUT, "length") for _ in range(3)])
        task_id = _run(store, registry, "openai", max_output_tokens=4096, max_tokens=2_000)
        sent = len(server.requests)
    budget = store.budgets.get(task_id)
    assert (sent, budget.known, budget.unknown, budget.reserved) == (1, BILLED, 0, 0)
    task = store.tasks.get(task_id)
    assert (task.status, (task.error or {}).get("code")) == (TaskStatus.COST_EXCEEDED, "budget_exceeded"), task.error
