"""The model of the outage drills (tests/test_outage.py, bench/outage.py): lookups, then an
answer, served by ``FakeMessagesAPI``; while ``down`` every connection is reset. Every call is
counted with its time and whether the server was down."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests.fake_messages_api import RecordedRequest, message_reply

LOOKUP_TASK = {
    "goal": "look up",
    "provider": "anthropic",
    "model": "claude-sonnet-4-6",
    "constraints": {"tools": ["lookup"]},
}


class OutageModel:
    def __init__(self, turns: int = 3) -> None:
        self.turns = turns  # LLM calls per task: turns - 1 lookups, then the answer
        self.down = False
        self.lock = threading.Lock()
        self.calls: list[tuple[float, bool]] = []  # (when, while down)

    def __call__(self, request: RecordedRequest) -> Any:
        with self.lock:
            self.calls.append((time.time(), self.down))
            if self.down:
                return None  # the connection is reset, as a dead endpoint's would be
        turns = sum(1 for m in request.body["messages"] if m["role"] == "assistant")
        usage = {"input_tokens": len(json.dumps(request.body["messages"])) // 4, "output_tokens": 20}
        time.sleep(0.2)
        if turns < self.turns - 1:
            use = {"type": "tool_use", "id": f"toolu_o{turns}", "name": "lookup", "input": {"query": f"q{turns}"}}
            return message_reply([use], stop_reason="tool_use", usage=usage)
        return message_reply([{"type": "text", "text": "done"}], usage=usage)


def submit_lookups(stack: LocalStack, count: int, tenant: str) -> tuple[Storage, Any, list[str]]:
    """``count`` tasks that look things up through the model (``LOOKUP_TASK``), on a started
    stack; returns its store, its queues and the task ids."""
    from agentq.control.submit import submit
    from agentq.runtime import build_registry

    assert stack.settings is not None
    store, queues = stack.store(), stack.queues()
    registry = build_registry(stack.settings)
    ids = [submit(store, registry, LOOKUP_TASK, tenant=tenant, queues=queues).task_id for _ in range(count)]
    return store, queues, ids
