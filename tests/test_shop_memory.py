"""examples/shop's support agent remembers a customer across tasks: the first task writes what
the customer asked about their order into the `customers` memory store, the second task, a week
later in the story, reads it and the model is sent that earlier order. On the local stack
through the CLI (in this process), the real `anthropic` SDK against a local Messages API server."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from agentq.cli.main import main
from agentq.core.memory import content_sha256
from agentq_dev.stack import LocalStack

from tests.fake_messages_api import FakeMessagesAPI, anthropic_env, text_reply, tool_use_reply

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "shop"
ADA = "/customers/ada@example.com.md"
FIRST_NOTE = "2026-11-19: asked where order 17 (4200 cents, delivered) is; said it never arrived"


def test_the_support_agent_remembers_a_customers_earlier_order_in_its_next_task(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    with FakeMessagesAPI() as model:
        model.enqueue(
            # task 1: a new customer asks about order 17
            tool_use_reply("memory_read", {"store": "customers", "path": ADA}),
            tool_use_reply("lookup_order", {"order_id": "17"}),
            tool_use_reply("memory_write", {"store": "customers", "path": ADA, "content": FIRST_NOTE}),
            text_reply("Order 17 shows as delivered; I have noted that it never arrived."),
            # task 2: the same customer comes back without naming the order
            tool_use_reply("memory_read", {"store": "customers", "path": ADA}),
            tool_use_reply(
                "memory_write",
                {
                    "store": "customers",
                    "path": ADA,
                    "content": FIRST_NOTE + "\n2026-11-26: came back about order 17",
                    "expected_sha256": content_sha256(FIRST_NOTE),
                },
            ),
            text_reply("You wrote about order 17 last week; it is still marked delivered."),
        )
        with LocalStack(
            prefix=f"supp{uuid.uuid4().hex[:8]}",
            workers=1,
            tool_modules=("shop_tools",),
            extra_env={
                "PYTHONPATH": os.pathsep.join([str(EXAMPLE / "src"), str(ROOT)]),
                **anthropic_env(model, "sk-ant-local"),
            },
        ) as stack:
            assert stack.api_server is not None
            env = stack.env(AGENTQ_URL=stack.api_server.url)

            for key, value in env.items():  # a person's shell after `agentq dev`: the CLI runs in this process
                monkeypatch.setenv(key, value)

            def agentq(*args: str) -> str:
                capsys.readouterr()
                code = main(list(args))
                out, err = capsys.readouterr()
                assert code == 0, err
                return out

            agentq("memory", "create", "customers", "--description", "what each customer ordered and asked about")
            assert agentq("agents", "create", "-f", str(EXAMPLE / "support.yaml")).strip() == "support@1"
            first = agentq("submit", "--agent", "support", "Hi, it's ada@example.com: where is order 17?", "--wait")
            assert first.startswith("Order 17 shows as delivered")
            second = agentq("submit", "--agent", "support", "ada@example.com again: any news on my order?", "--wait")
            assert second.startswith("You wrote about order 17 last week")
            history = json.loads(agentq("memory", "history", "customers", ADA, "--json"))

    # The second task's model was sent what the first task wrote (its memory_read result).
    second_task_reads = model.requests[5].body["messages"][-1]["content"][0]
    assert second_task_reads["type"] == "tool_result" and FIRST_NOTE in json.dumps(second_task_reads["content"])
    assert [t["name"] for t in model.requests[4].body["tools"]] == [
        "lookup_order", "memory_list", "memory_read", "memory_write", "memory_search",
    ]  # fmt: skip
    assert [(v["version"], v["created_by"]["type"], v["created_by"]["step"]) for v in history] == [
        (2, "task", 3),
        (1, "task", 5),
    ]
