"""Small builders for the conformance tests."""

from __future__ import annotations

import time
from decimal import Decimal

from agentq.core.models import Lease, LLMStep, ToolOutcome, ToolsStep, Usage
from agentq.core.records import BudgetDelta
from agentq.storage.container import Storage

from tests.helpers import scripted


def new_task(store: Storage, *, tenant: str = "t", max_tokens: int = 10_000) -> str:
    return store.tasks.create(scripted([{"text": "x"}], max_tokens=max_tokens), tenant=tenant).task_id


def claimed(store: Storage, **kwargs: object) -> Lease:
    task_id = new_task(store, **kwargs)  # type: ignore[arg-type]
    got = store.tasks.claim(task_id, "w1", 30)
    assert got is not None
    return got[0]


def llm_step(tokens_in: int = 100, tokens_out: int = 10, text: str = "hi") -> LLMStep:
    return LLMStep(
        content=[{"type": "text", "text": text}],
        stop_reason="end_turn",
        model="scripted",
        usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out),
        started_at=time.time(),
        duration_ms=5,
    )


def tools_step(content: str = "result") -> ToolsStep:
    return ToolsStep(
        results=[ToolOutcome(tool_use_id="tu1", name="lookup", content=content, started_at=time.time(), duration_ms=1)]
    )


def usage(reserved: int, used: int) -> BudgetDelta:
    return BudgetDelta(reserved=reserved, used=used, cost_usd=Decimal("0.001"), tokens_in=used - 10, tokens_out=10)
