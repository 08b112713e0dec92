"""Context management: past the threshold of the model's window, old tool results are cleared
from what is sent (never from the steps), the latest ones kept, and the model can read any of
them back with ``recall``; the boundary is recorded on each LLM step, so a resumed worker sends
exactly the request the first one did; a threshold that cannot work is refused at submission."""

from __future__ import annotations

from typing import Any

import pytest

from agentq.control.submit import parse_submission, submit
from agentq.core.engine import Engine, EngineConfig, LeaseState, Session, conversation
from agentq.core.errors import ValidationError
from agentq.core.models import Lease, LLMStep, TaskStatus, ToolsStep, Usage
from agentq.core.providers import LLMRequest, LLMResponse
from agentq.core.tools import ToolRegistry, tool
from agentq.runtime import Settings, build_queues
from agentq.storage.container import Storage
from agentq_dev.moto_server import MotoServer

DOC = 1500  # characters per document: ~500 tokens by the engine's estimate


@tool(name="read_doc")
def read_doc(n: int) -> str:
    """Read document n."""
    return f"doc {n}: " + ("lorem ipsum " * 200)[:DOC]


class RecordingModel:
    """Reads documents 1..docs, recalls document 1, then answers; keeps every request."""

    name = "anthropic"

    def __init__(self, docs: int) -> None:
        self.docs = docs
        self.requests: list[LLMRequest] = []

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        results = [b for m in request.messages if isinstance(m["content"], list) for b in m["content"]
                   if b.get("type") == "tool_result"]  # fmt: skip
        n = len(results)
        if n < self.docs:
            content = [{"type": "tool_use", "id": f"toolu_{n + 1:03d}", "name": "read_doc", "input": {"n": n + 1}}]
        elif n == self.docs:
            content = [
                {"type": "tool_use", "id": "toolu_recall", "name": "recall", "input": {"tool_use_id": "toolu_001"}}
            ]
        else:
            content = [{"type": "text", "text": "done"}]
        stop = "tool_use" if content[0]["type"] == "tool_use" else "end_turn"
        return LLMResponse(
            content=content, stop_reason=stop, model=request.model, usage=Usage(input_tokens=100, output_tokens=10)
        )


def _submission(**constraints: Any) -> dict[str, Any]:
    return {"goal": "read them all", "provider": "anthropic", "model": "claude-sonnet-4-6",
            "constraints": {"tools": ["read_doc"], "max_steps": 40, "keep_tool_results": 2, **constraints}}  # fmt: skip


def test_old_results_are_cleared_past_the_threshold_and_recall_reads_them_back(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", '{"claude-sonnet-4": 5000}')  # a small window: 3,500 tokens
    model = RecordingModel(docs=12)
    task = store.tasks.create(parse_submission(_submission()), tenant="t")
    engine = Engine(store, worker_id="w", tools=ToolRegistry([read_doc]), config=EngineConfig(lease_seconds=30),
                    providers=lambda _: model)  # fmt: skip
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED

    steps = store.steps.load(task.task_id)
    boundaries = [s.body.cleared_before for s in steps if isinstance(s.body, LLMStep)]
    assert boundaries == sorted(boundaries) and boundaries[-1] > 0  # moved up, never back
    last = model.requests[-2]  # the call that recalled document 1
    sent = [b["content"] for m in last.messages if isinstance(m["content"], list) for b in m["content"]
            if b.get("type") == "tool_result"]  # fmt: skip
    assert (
        sent[0].startswith("[cleared to save context: read_doc returned")
        and "recall(tool_use_id='toolu_001')" in sent[0]
    )
    assert sent[-1].startswith("doc 12:") and sent[-2].startswith("doc 11:")  # the latest kept whole
    assert "recall" in [t["name"] for t in last.tools]
    assert all(len(m.messages) and sum(len(str(x)) for x in m.messages) < 5000 * 3 for m in model.requests)
    stored = [r for s in steps if isinstance(s.body, ToolsStep) for r in s.body.results]
    assert stored[0].content.startswith("doc 1:")  # the steps keep everything
    recalled = next(r for r in stored if r.name == "recall")
    assert recalled.content == stored[0].content and not recalled.is_error

    # A resumed worker rebuilds exactly the request each call sent.
    for i, record in enumerate(steps):
        if isinstance(record.body, LLMStep):
            lease = Lease(task_id=task.task_id, owner="resumed", epoch=2, expires_at=0)
            messages_so_far = conversation(task.submission.goal, steps[:i])
            session = Session(
                held=LeaseState(lease), task=task, steps=steps[:i], messages=messages_so_far, deadline=None
            )
            messages, boundary, _ = engine._requests.context(session)
            assert boundary == record.body.cleared_before
            assert messages == model.requests[sum(isinstance(s.body, LLMStep) for s in steps[:i])].messages


def test_a_threshold_the_system_prompt_alone_passes_is_refused_naming_it(
    store: Storage, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", '{"claude-sonnet-4": 20000}')
    body = _submission(context_threshold=0.2)  # 4,000 tokens
    body["system"] = "You are thorough. " * 1000  # ~6,000 tokens by the engine's estimate
    with pytest.raises(ValidationError) as refused:
        submit(store, ToolRegistry([read_doc]), body, tenant="t", queues=build_queues(settings))
    assert refused.value.field == "constraints.context_threshold"
    with pytest.raises(ValidationError) as bad:
        parse_submission(_submission(context_threshold=1.5))
    assert bad.value.field == "constraints.context_threshold"


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_fork_before_or_after_the_clearing_sends_what_the_source_sent_next(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A fork copies the steps, and with them each call's boundary: its next request is the
    one the source sent at that point, cleared results and all."""
    from agentq.control.operations import fork
    from agentq.runtime import build_store

    from tests.helpers import deployment

    settings = deployment(moto_server)  # with queues: a fork is enqueued
    store = build_store(settings)

    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", '{"claude-sonnet-4": 5000}')
    source_model = RecordingModel(docs=12)
    task = store.tasks.create(parse_submission(_submission()), tenant="t")
    registry = ToolRegistry([read_doc])
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30),
                    providers=lambda _: source_model)  # fmt: skip
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    steps = store.steps.load(task.task_id)
    llm_steps = [(s.number, s.body) for s in steps if isinstance(s.body, LLMStep)]
    first_cleared = next(i for i, (_, body) in enumerate(llm_steps) if body.cleared_before > 0)
    call = first_cleared - 1 if where == "before" else first_cleared + 1
    at_step = llm_steps[call][0] - 1  # the fork's next call is the source's call number `call`

    forked = fork(store, registry, build_queues(settings), task.task_id, at_step=at_step, tenant="t")
    fork_model = RecordingModel(docs=12)
    fork_engine = Engine(store, worker_id="w2", tools=registry, config=EngineConfig(lease_seconds=30),
                         providers=lambda _: fork_model)  # fmt: skip
    assert fork_engine.run(forked.task_id).status is TaskStatus.SUCCEEDED

    def results(request: LLMRequest) -> list[str]:
        return [str(b["content"])[:60] for m in request.messages if isinstance(m["content"], list)
                for b in m["content"] if b.get("type") == "tool_result"]  # fmt: skip

    assert results(fork_model.requests[0]) == results(source_model.requests[call])
    assert fork_model.requests[0].tools == source_model.requests[call].tools  # recall offered alike
