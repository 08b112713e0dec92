"""No call of a model's turn that gives one tool_use id to two calls is ever made. A call's
policy verdict, approval and effect record are found by its id (``PolicyGate.tool_verdicts``),
so two calls under one id shared one verdict: a 50,000-cent charge ran under the verdict of a
5-cent one, past a rule denying charges above 100. The Anthropic, OpenAI and Bedrock APIs make
their ids themselves; a gateway or an OpenAI-compatible server that passes the model's own
through may repeat one.

Every provider's reader refuses such a reply as malformed (``providers.retry.distinct_tool_uses``:
retried, then the task fails ``malformed_response``), through each real SDK against its local
server, plain and streamed, and an economy batch's answer; and the engine makes none of a
turn's calls when its ids repeat, whatever provider answered it (``core.engine._tool_turn``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission, ToolsStep, Usage
from agentq.core.policies import check
from agentq.core.providers import LLMRequest, LLMResponse
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_messages_api import FakeMessagesAPI, message_reply, point_anthropic_at
from tests.fake_model_servers import FakeChatCompletions, FakeConverse, chat_completion, converse_reply, point_boto3_at

STORAGE = "memory"
RULE = """@id("no-big-charges") @message("no charge above 100")
forbid(principal, action == Action::"tool", resource == Tool::"charge_card")
when { context.args has amount_cents && context.args.amount_cents > 100 };"""
BIG, SMALL = {"amount_cents": 50_000, "memo": "big"}, {"amount_cents": 5, "memo": "small"}
SAME = "toolu_same"
ATTEMPTS = 2
MODELS = {"anthropic": "claude-sonnet-4-6", "bedrock": "anthropic.claude-sonnet-4-5-20250929-v1:0",
          "openai": "gpt-4.1-mini", "bedrock-converse": "us.amazon.nova-pro-v1:0"}  # fmt: skip
PATHS = ["anthropic", "anthropic streamed", "anthropic economy", "bedrock", "openai", "openai streamed",
         "bedrock-converse", "bedrock-converse streamed"]  # fmt: skip


def _anthropic(api: FakeMessagesAPI) -> None:
    uses = [{"type": "tool_use", "id": SAME, "name": "charge_card", "input": i} for i in (BIG, SMALL)]
    api.enqueue(*[message_reply(uses, stop_reason="tool_use") for _ in range(ATTEMPTS)])


def _openai(chat: FakeChatCompletions) -> None:
    for _ in range(ATTEMPTS):
        reply = chat_completion(None, [("charge_card", BIG), ("charge_card", SMALL)])
        assert isinstance(reply.body, dict)
        for made in reply.body["choices"][0]["message"]["tool_calls"]:
            made["id"] = SAME
        chat.enqueue(reply)


def _converse(converse: FakeConverse) -> None:
    for _ in range(ATTEMPTS):
        reply = converse_reply(None, [("charge_card", BIG), ("charge_card", SMALL)])
        assert isinstance(reply.body, dict)
        for block in reply.body["output"]["message"]["content"]:
            block["toolUse"]["toolUseId"] = SAME
        converse.enqueue(reply)


@pytest.fixture
def denying(store: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The tenant's rule denying charges above 100; yields the ledger every charge made writes to."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", json.dumps({"max_attempts": ATTEMPTS, "base_delay": 0, "max_delay": 0}))
    store.policies.put("acme", "tenant", RULE, check(RULE).digest)
    yield ledger


def _engine(store: Storage, registry: ToolRegistry, **kwargs: Any) -> Engine:
    config = EngineConfig(lease_seconds=30, policy_cache_seconds=0)
    return Engine(store, worker_id="w", tools=registry, config=config, **kwargs)


def _submission(provider: str, **constraints: Any) -> TaskSubmission:
    return TaskSubmission.model_validate({"goal": "pay", "provider": provider, "model": MODELS[provider],
                                          "constraints": {"tools": ["charge_card"], **constraints}})  # fmt: skip


@pytest.mark.parametrize("path", PATHS)
def test_a_reply_giving_two_calls_one_id_is_malformed_on_every_provider_path_and_no_call_is_made(
    path: str, store: Storage, registry: ToolRegistry, denying: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each provider, plain and streamed (and Anthropic's batch), answers a turn giving a
    50,000-cent charge and a 5-cent one one id, at every attempt: the task fails
    ``malformed_response`` naming the id, and neither charge is made."""
    provider, _, how = path.partition(" ")
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "0" if how == "streamed" else "100000")
    with ExitStack() as stack:
        if provider in ("anthropic", "bedrock"):
            server: Any = stack.enter_context(FakeMessagesAPI(batch_seconds=0))
            point_anthropic_at(server, monkeypatch.setenv)
            monkeypatch.setenv("AGENTQ_BEDROCK_BASE_URL", server.base_url)
            for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                                ("AWS_SESSION_TOKEN", "testing"), ("AWS_REGION", "us-east-1")):  # fmt: skip
                monkeypatch.setenv(name, value)
            monkeypatch.delenv("AWS_BEARER_TOKEN_BEDROCK", raising=False)
            _anthropic(server)
        elif provider == "openai":
            server = stack.enter_context(FakeChatCompletions())
            monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
            monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
            _openai(server)
        else:
            server = stack.enter_context(FakeConverse())
            point_boto3_at(server, monkeypatch.setenv)
            _converse(server)
        task = store.tasks.create(_submission(provider, economy=how == "economy"), tenant="acme")
        engine = _engine(store, registry)
        result = engine.run(task.task_id)
        if how == "economy":  # the answer is read by the run after the batch ends
            assert result.outcome == "waiting"
            store.tasks.transition(task.task_id, TaskStatus.QUEUED)  # what the poll message does
            result = engine.run(task.task_id)
        assert not denying.exists(), f"a call of the turn was made: {denying.read_text()}"
        ended = store.tasks.get(task.task_id)
        assert ended.status is TaskStatus.FAILED and ended.error is not None, ended.error
        assert ended.error["code"] == "malformed_response"
        assert f"tool_use id '{SAME}' is given to more than one call of the reply" in ended.error["message"]
        assert len(server.requests) == (1 if how == "economy" else ATTEMPTS)
        if provider in ("anthropic", "openai"):  # the path asked for: streamed or not (Converse's is its own route)
            assert {bool(r.body.get("stream")) for r in server.requests} == {how == "streamed"}
    assert not any(isinstance(r.body, LLMStep | ToolsStep) for r in store.steps.load(task.task_id))


class _RepeatingProvider:
    """A provider that checks nothing: its one turn gives both charges one id, then it answers."""

    name = "scripted"

    def __init__(self) -> None:
        self.turns = 0

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.turns += 1
        uses = [{"type": "tool_use", "id": SAME, "name": "charge_card", "input": i} for i in (BIG, SMALL)]
        content = uses if self.turns == 1 else [{"type": "text", "text": "done"}]
        return LLMResponse(content=content, stop_reason="tool_use" if self.turns == 1 else "end_turn",
                           model=request.model, usage=Usage(input_tokens=10, output_tokens=5))  # fmt: skip


def test_the_engine_makes_no_call_of_a_turn_giving_two_calls_one_id_whatever_provider_answered_it(
    store: Storage, registry: ToolRegistry, denying: Path
) -> None:
    """Past a provider that does not check its ids (or a turn committed before the providers
    did): the turn's step is kept, each call is told it was not made, and the task fails
    ``malformed_response`` in the same commit; neither charge is made, nor is the model asked again."""
    model = _RepeatingProvider()
    sub = TaskSubmission.model_validate({"goal": "pay", "provider": "scripted", "script": {"turns": [{"text": "-"}]},
                                         "constraints": {"tools": ["charge_card"]}})  # fmt: skip
    task = store.tasks.create(sub, tenant="acme")
    result = _engine(store, registry, providers=lambda _: model).run(task.task_id)
    assert not denying.exists(), f"a call of the turn was made: {denying.read_text()}"
    assert result.status is TaskStatus.FAILED and model.turns == 1
    ended = store.tasks.get(task.task_id)
    said = f"not made: the model's turn gave tool_use id '{SAME}' to more than one call"
    assert ended.error == {"code": "malformed_response", "message": f"{said}; none of its calls was made"}
    asked, answered = (r.body for r in store.steps.load(task.task_id))
    assert isinstance(asked, LLMStep) and isinstance(answered, ToolsStep)
    assert [(o.tool_use_id, o.content, o.is_error) for o in answered.results] == [(SAME, said, True)] * 2
