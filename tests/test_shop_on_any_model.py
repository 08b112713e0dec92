"""The shop example's agent (examples/shop/agent.yaml) runs on a Bedrock Converse model and on
a local OpenAI-compatible server by changing only its ``provider`` and ``model``: the same tools,
the same approval of the refund, the same result (the Claude run through the CLI and the local
stack is tests/test_example_project.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from agentq.control.agents import create_agent
from agentq.control.submit import submit
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import CallStep, TaskStatus
from agentq.core.secrets import Secrets
from agentq.runtime import Settings, build_registry
from agentq.storage.container import Storage

from tests.fake_model_servers import (
    FakeChatCompletions,
    FakeConverse,
    FakeReply,
    Recorded,
    chat_completion,
    converse_reply,
    point_boto3_at,
)

STORAGE = "memory"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "shop"
ANSWER = "Refunded order 17 in full (4200 cents)."


def plan(turn: int, reply: Callable[..., FakeReply]) -> FakeReply:
    """The refund agent's three turns: look the order up, refund it, say so."""
    if turn == 0:
        return reply(None, [("lookup_order", {"order_id": "17"})])
    if turn == 1:
        return reply(None, [("refund_order", {"order_id": "17", "amount_cents": 4200, "reason": "never arrived"})])
    return reply(ANSWER)


def chat_plan(recorded: Recorded) -> FakeReply:
    return plan(sum(1 for m in recorded.body["messages"] if m["role"] == "assistant"), chat_completion)


def converse_plan(recorded: Recorded) -> FakeReply:
    return plan(sum(1 for m in recorded.body["messages"] if m["role"] == "assistant"), converse_reply)


@pytest.fixture
def shop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    monkeypatch.setenv("AGENTQ_SECRET_NAMES", "shop-api-key")
    monkeypatch.setenv("AGENTQ_SECRET_SHOP_API_KEY", "shop-secret")
    ledger = tmp_path / "refunds.jsonl"
    monkeypatch.setenv("SHOP_REFUND_LEDGER", str(ledger))
    yield ledger


@pytest.mark.parametrize(
    ("provider", "model"), [("openai", "gpt-4.1-mini"), ("bedrock-converse", "us.amazon.nova-pro-v1:0")]
)
def test_the_shop_agent_runs_on_another_model_by_changing_its_provider_and_model(
    provider: str, model: str, shop: Path, store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = FakeChatCompletions(responder=chat_plan) if provider == "openai" else FakeConverse(responder=converse_plan)
    with server:
        if isinstance(server, FakeChatCompletions):
            monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        else:
            point_boto3_at(server, monkeypatch.setenv)
        registry = build_registry(Settings(table="memory", bucket="memory", tool_modules=("shop_tools",)))
        spec = {**yaml.safe_load((EXAMPLE / "agent.yaml").read_text()), "provider": provider, "model": model}
        create_agent(store, registry, spec, tenant="t")
        task = submit(store, registry, {"goal": "Order 17 never arrived; please refund it.", "agent": "refunds"},
                      tenant="t")  # fmt: skip

        def run(worker: str) -> TaskStatus | None:
            engine = Engine(store, worker_id=worker, tools=registry, config=EngineConfig(lease_seconds=5),
                            secrets=Secrets.from_env())  # fmt: skip
            return engine.run(task.task_id).status

        assert run("w1") is TaskStatus.PAUSED  # the refund waits for a person
        assert not shop.exists()
        pending = store.approvals.pending(task.task_id)
        assert pending is not None
        store.approvals.decide(task.task_id, pending.use_id, approved=True, note="checked", by="alice")
        assert run("w2") is TaskStatus.SUCCEEDED
        sent = server.requests[0].body

    assert store.tasks.get(task.task_id).result == ANSWER
    [refund] = [json.loads(line) for line in shop.read_text().splitlines()]
    assert refund["order_id"] == "17" and refund["amount_cents"] == 4200 and refund["authenticated"]
    steps = [r.body for r in store.steps.load(task.task_id) if isinstance(r.body, CallStep)]
    assert {(s.provider, s.model) for s in steps} == {(provider, model)}
    system = sent["messages"][0]["content"] if provider == "openai" else sent["system"][0]["text"]
    assert system.startswith("You handle refund requests")
