"""Compaction: when clearing old tool results does not bring the request under the threshold,
the next call is a summary, committed as its own step and charged like any call; the
conversation goes on from the goal and that summary; a resume reads only the steps from the
latest compaction on; a worker killed at any write around a compaction resumes to the same
conversation; a fork before or after one goes on as the source did.

All of it is the engine's own behaviour and runs on the in-memory twin (``store``, ``registry``):
a killed worker is one stopped dead at its crash point (tests/stopped_worker.py), a fork's
queue a stand-in that keeps what was enqueued."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentq.api.views import trace_page
from agentq.control.submit import parse_submission
from agentq.core.context import COMPACT_INSTRUCTION, resumed_goal
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ProviderError, ValidationError
from agentq.core.models import CallStep, CompactStep, LLMStep, StepRecord, TaskStatus, ToolsStep, Usage
from agentq.core.providers import LLMRequest, LLMResponse
from agentq.core.providers.base import max_call_seconds
from agentq.core.tools import ToolRegistry, tool
from agentq.runtime import Settings, build_registry
from agentq.storage.container import Storage, memory_storage

from tests.helpers import call, scripted, wait_for
from tests.stopped_worker import resume, stopped_at

WINDOW = '{"claude-sonnet-4": 5000}'  # threshold 70%: 3,500 tokens, ~10,500 characters
NOTES = "n" * 2400  # what the model writes each turn: clearing tool results cannot remove it


@tool(name="read_doc")
def read_doc(n: int) -> str:
    """Read document n."""
    return f"doc {n}: " + "lorem ipsum " * 20


class SummarisingModel:
    """Reads documents 1..docs, writing long notes each turn; summarises when asked to; then
    answers. Keeps every request. ``fail_at``: that call raises a retryable error once."""

    name = "anthropic"

    def __init__(self, docs: int, fail_at: int | None = None) -> None:
        self.docs = docs
        self.read = 0
        self.fail_at = fail_at
        self.requests: list[LLMRequest] = []

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        if len(self.requests) == self.fail_at:
            self.fail_at = None
            raise ProviderError("overloaded", retryable=True, code="overloaded")
        last = request.messages[-1]["content"]
        usage = Usage(input_tokens=len(str(request.messages)) // 4, output_tokens=50)
        if isinstance(last, list) and last[-1].get("text") == COMPACT_INSTRUCTION:
            text = f"SUMMARY: documents 1 to {self.read} read; all were lorem ipsum."
            return LLMResponse(content=[{"type": "text", "text": text}], stop_reason="end_turn",
                               model=request.model, usage=usage)  # fmt: skip
        self.note(request)
        if self.read >= self.docs:
            return LLMResponse(content=[{"type": "text", "text": f"read {self.read} documents"}],
                               stop_reason="end_turn", model=request.model, usage=usage)  # fmt: skip
        n = self.read + 1
        content: list[dict[str, Any]] = [
            {"type": "text", "text": f"notes on {self.read}: {NOTES}"},
            {"type": "tool_use", "id": f"toolu_{n:03d}", "name": "read_doc", "input": {"n": n}},
        ]
        return LLMResponse(content=content, stop_reason="tool_use", model=request.model, usage=usage)

    def note(self, request: LLMRequest) -> None:
        """Count the documents read so far from the latest tool result."""
        last = request.messages[-1]["content"]
        if isinstance(last, list) and last[-1].get("type") == "tool_result" and last[-1]["content"].startswith("doc"):
            self.read = max(self.read, int(last[-1]["content"].split(":")[0].split()[-1]))


def _is_compaction(request: LLMRequest) -> bool:
    last = request.messages[-1]["content"]
    return isinstance(last, list) and last[-1].get("text") == COMPACT_INSTRUCTION


def _submission(**constraints: Any) -> dict[str, Any]:
    return {"goal": "read them all", "provider": "anthropic", "model": "claude-sonnet-4-6",
            "constraints": {"tools": ["read_doc"], "max_steps": 40, "keep_tool_results": 1, **constraints}}  # fmt: skip


# The engine's own behaviour needs no AWS: ``store`` and ``registry`` (tests/conftest.py) are the in-memory twin's.
STORAGE = "memory"


def _engine(store: Storage, model: SummarisingModel) -> Engine:
    return Engine(store, worker_id="w", tools=ToolRegistry([read_doc]), config=EngineConfig(lease_seconds=30),
                  providers=lambda _: model)  # fmt: skip


def test_when_clearing_is_not_enough_a_summary_step_is_committed_and_the_conversation_goes_on_from_it(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", WINDOW)
    model = SummarisingModel(docs=10)
    task = store.tasks.create(parse_submission(_submission()), tenant="t")
    assert _engine(store, model).run(task.task_id).status is TaskStatus.SUCCEEDED

    steps = store.steps.load(task.task_id)
    compactions = [s for s in steps if isinstance(s.body, CompactStep)]
    assert len(compactions) >= 2
    for record in compactions:
        assert isinstance(record.body, CompactStep) and record.body.summarised_through == record.number - 1
        assert record.body.text().startswith("SUMMARY: documents 1 to")
    assert store.tasks.get(task.task_id).compacted_at == compactions[-1].number

    # Each compaction sends the turn's own request plus the instruction, then the next turn
    # starts from the goal and the summary alone.
    asks = [i for i, r in enumerate(model.requests) if _is_compaction(r)]
    assert len(asks) == len(compactions)
    for i, record in zip(asks, compactions, strict=True):
        assert isinstance(record.body, CompactStep)
        ask, after = model.requests[i], model.requests[i + 1]
        assert ask.tools[0]["name"] == "read_doc" and ask.messages[-1]["content"][0]["type"] == "tool_result"
        assert after.messages == [{"role": "user", "content": resumed_goal("read them all", record.body.text())}]
        assert "recall" in [t["name"] for t in after.tools]
    limit = 5000 * 0.7 * 3  # characters, by the engine's own estimate
    turns = [r for j, r in enumerate(model.requests) if j not in asks]
    assert all(len(str(r.messages)) < limit for r in turns)

    # Charged like any call: the budget holds every call's usage, the task every call's cost.
    calls = [s.body for s in steps if isinstance(s.body, CallStep)]
    budget = store.budgets.get(task.task_id)
    assert budget.used == sum(c.usage.total for c in calls) and budget.reserved == 0
    assert store.tasks.get(task.task_id).cost_usd == sum(c.cost_usd for c in calls) > 0
    assert store.tasks.get(task.task_id).llm_steps == sum(isinstance(c, LLMStep) for c in calls)

    # In the trace: an llm_call whose purpose is compaction, its text the summary.
    events = trace_page(store, store.tasks.get(task.task_id), limit=500, cursor=None).events
    summaries = [e for e in events if e.type == "llm_call" and e.purpose == "compaction"]
    assert [e.step for e in summaries] == [r.number for r in compactions]
    assert summaries[0].text.startswith("SUMMARY:")


def test_recall_reads_back_a_result_from_before_the_compaction(store: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", WINDOW)

    class Recalling(SummarisingModel):
        """Once every document is read, recalls the first one (long cleared and compacted away)."""

        recalled = False

        def complete(self, request: LLMRequest) -> LLMResponse:
            self.note(request)
            if self.read < self.docs or self.recalled or _is_compaction(request):
                return super().complete(request)
            self.recalled = True
            self.requests.append(request)
            use = {"type": "tool_use", "id": "toolu_recall", "name": "recall", "input": {"tool_use_id": "toolu_001"}}
            usage = Usage(input_tokens=10, output_tokens=10)
            return LLMResponse(content=[use], stop_reason="tool_use", model=request.model, usage=usage)

    model = Recalling(docs=8)
    task = store.tasks.create(parse_submission(_submission()), tenant="t")
    engine = _engine(store, model)
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    steps = store.steps.load(task.task_id)
    first_compaction = next(s.number for s in steps if isinstance(s.body, CompactStep))
    recalled = next(r for s in steps if isinstance(s.body, ToolsStep) for r in s.body.results if r.name == "recall")
    assert not recalled.is_error and recalled.content.startswith("doc 1: lorem ipsum")
    assert first_compaction < next(
        s.number for s in steps if isinstance(s.body, ToolsStep) and s.body.results[0].name == "recall"
    )


def test_a_resume_reads_only_the_steps_from_the_latest_compaction_and_sends_the_same_request(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", WINDOW)
    reference = SummarisingModel(docs=10)
    first = store.tasks.create(parse_submission(_submission()), tenant="t")
    assert _engine(store, reference).run(first.task_id).status is TaskStatus.SUCCEEDED
    asks = [i for i, r in enumerate(reference.requests) if _is_compaction(r)]
    fail_at = asks[0] + 3  # the second turn after the first compaction

    model = SummarisingModel(docs=10, fail_at=fail_at + 1)
    task = store.tasks.create(parse_submission(_submission()), tenant="t")
    engine = _engine(store, model)
    assert engine.run(task.task_id).outcome == "retry"  # the worker gave the task back
    compacted_at = store.tasks.get(task.task_id).compacted_at
    assert compacted_at > 0
    loads: list[tuple[int | None, int]] = []
    real_load = store.steps.load

    def load(task_id: str, upto: int | None = None, since: int = 1) -> list[StepRecord]:
        loads.append((upto, since))
        return real_load(task_id, upto=upto, since=since)

    monkeypatch.setattr(store.steps, "load", load)
    resumed = engine.run(task.task_id)
    assert resumed.status is TaskStatus.SUCCEEDED and resumed.resumed_from_step > compacted_at
    assert loads[0][1] == compacted_at  # the claim read the compaction step and what followed it
    assert model.requests[fail_at + 1] == model.requests[fail_at]  # the retried call is the failed one
    monkeypatch.setattr(store.steps, "load", real_load)
    assert [s.body.kind for s in store.steps.load(task.task_id)] == [
        s.body.kind for s in store.steps.load(first.task_id)
    ]


def test_compaction_off_sends_the_request_as_it_is(store: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", WINDOW)
    model = SummarisingModel(docs=6)
    task = store.tasks.create(parse_submission(_submission(compaction="off")), tenant="t")
    assert _engine(store, model).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert not any(isinstance(s.body, CompactStep) for s in store.steps.load(task.task_id))
    with pytest.raises(Exception, match="compaction"):
        parse_submission(_submission(compaction="sometimes"))


# ---------------------------------------------------------------------- killed workers and forks

TASK_ID = "compact-task"
LONG = "x" * 3000  # each scripted turn's text: a compaction every few turns
TURNS: list[dict[str, Any]] = (
    [{"text": f"look {i} {LONG}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(3)]
    + [
        {"text": f"pay {LONG}", "tool_calls": [call("charge_card", amount_cents=100, memo="one")]},
    ]
    + [{"text": f"look {i} {LONG}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(4, 8)]
    + [
        {"text": "final answer"},
    ]
)
WINDOWS = '{"claude-sonnet-4": 4000}'  # threshold 2,800 tokens, ~8,400 characters: about two turns


def _shape(steps: list[StepRecord]) -> list[Any]:
    out: list[Any] = []
    for record in steps:
        body = record.body
        if isinstance(body, CallStep):
            out.append((body.kind, body.content, body.usage.model_dump()))
        else:
            assert isinstance(body, ToolsStep)
            out.append(("tools", [(r.tool_use_id, r.name, r.content) for r in body.results]))
    return out


@pytest.fixture(scope="module")
def baseline() -> list[StepRecord]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AGENTQ_CONTEXT_WINDOWS", WINDOWS)
        store = memory_storage()
        store.tasks.create(scripted(TURNS, tools=["lookup", "charge_card"]), tenant="t", task_id=TASK_ID)
        engine = Engine(store, worker_id="baseline", tools=_effect_tools(), config=EngineConfig(lease_seconds=5))
        assert engine.run(TASK_ID).status is TaskStatus.SUCCEEDED
    return store.steps.load(TASK_ID)


def _effect_tools() -> ToolRegistry:
    return build_registry(Settings(table="memory", bucket="memory", tool_modules=("tests.effect_tools",)))


def _pass_of(steps: list[StepRecord], point: str, which: int) -> int:
    """The pass of ``point`` that belongs to the ``which``-th compaction of an uninterrupted run."""
    number = [s.number for s in steps if isinstance(s.body, CompactStep)][which]
    before = steps[:number]  # the compaction and every step before it
    calls = sum(isinstance(s.body, CallStep) for s in before)
    return {"after_reserve": calls, "after_llm_call": calls, "after_step_put": number, "after_compaction": which + 1}[
        point
    ]


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("point", ["after_reserve", "after_llm_call", "after_step_put", "after_compaction"])
def test_a_worker_killed_around_a_compaction_resumes_to_the_same_conversation(
    point: str, which: int, baseline: list[StepRecord], store: Storage, registry: ToolRegistry, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The killed worker stops dead at the point in a thread (tests/stopped_worker.py): it
    writes nothing more, as a SIGKILLed process would; its successor waits out its lease."""
    assert sum(isinstance(s.body, CompactStep) for s in baseline) >= 2
    crash_at = f"{point}:{_pass_of(baseline, point, which)}"
    store.tasks.create(scripted(TURNS, tools=["lookup", "charge_card"]), tenant="t", task_id=TASK_ID)
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", WINDOWS)
    killed = Engine(store, worker_id="killed", tools=registry, config=EngineConfig(lease_seconds=1, max_call_seconds=1))
    with stopped_at(killed, TASK_ID, crash_at, monkeypatch):
        before = store.steps.load(TASK_ID)
        # The killed worker's hold for its call in flight (or for its next one): an outcome no
        # one can know, so it is counted spent at its deadline: by the successor's claim when it
        # claims after the deadline (a loaded machine), else below, from the lapsed holds.
        left = store.tasks.get(TASK_ID).inflight
        number = [s.number for s in baseline if isinstance(s.body, CompactStep)][which]
        assert len(before) == (number if point == "after_compaction" else number - 1)  # stopped where meant

        config = EngineConfig(lease_seconds=1, max_call_seconds=max_call_seconds())  # as run_task's engine
        successor = Engine(store, worker_id="successor", tools=registry, config=config)
        resumed = resume(successor, TASK_ID, wait_seconds=20)
        assert resumed.status is TaskStatus.SUCCEEDED, resumed
    after = store.steps.load(TASK_ID)
    assert after[: len(before)] == before  # resumed, not restarted
    assert _shape(after) == _shape(baseline)
    charges = ledger.read_text().splitlines()
    assert len(charges) == 1  # the payment between the compactions ran once
    task = store.tasks.get(TASK_ID)
    assert task.compacted_at == [s.number for s in baseline if isinstance(s.body, CompactStep)][-1]
    if task.lapsed_holds:  # the killed worker's hold is counted spent once its call cannot complete
        import time

        assert left is not None and list(task.lapsed_holds.values()) == [left]
        time.sleep(max(0.0, max(h.until or 0.0 for h in task.lapsed_holds.values()) - time.time()) + 0.05)
        Engine(store, worker_id="releaser", tools=registry).spend_lapsed_holds(task)
    spent = left.amount if left is not None else 0
    budget = store.budgets.get(TASK_ID)
    assert budget.reserved == 0
    assert budget.used == spent + sum(s.body.usage.total for s in after if isinstance(s.body, CallStep))


class _Queues:
    """Stands in for TaskQueues: a fork is enqueued; here the test runs it itself."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, task_id: str, priority: Any, **_: Any) -> None:
        self.sent.append(task_id)


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_fork_before_or_after_a_compaction_goes_on_as_the_source_did(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    from agentq.control.operations import fork

    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", WINDOWS)
    source = store.tasks.create(scripted(TURNS, tools=["lookup", "charge_card"]), tenant="t")
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))
    assert engine.run(source.task_id).status is TaskStatus.SUCCEEDED
    steps = store.steps.load(source.task_id)
    compaction = next(s.number for s in steps if isinstance(s.body, CompactStep))
    at = compaction - 1 if where == "before" else compaction

    queues = _Queues()
    forked = fork(store, registry, queues, source.task_id, at_step=at)  # type: ignore[arg-type]
    assert forked.compacted_at == (compaction if where == "after" else 0) and queues.sent == [forked.task_id]
    assert engine.run(forked.task_id).status is TaskStatus.SUCCEEDED
    mine = store.steps.load(forked.task_id)

    def words(records: list[StepRecord]) -> list[Any]:
        return [(r.body.kind, r.body.text()[:40] if isinstance(r.body, CallStep) else len(r.body.results))
                for r in records if isinstance(r.body, CallStep | ToolsStep)]  # fmt: skip

    assert words(mine) == words(steps)  # the same turns, compactions at the same steps
    assert mine[:at] == [s.model_copy(update={"task_id": forked.task_id}) for s in steps[:at]]


def test_a_compaction_near_the_cap_is_sent_whole_or_not_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Near the cap an agent's answer may shrink to what is left, a summary never: a summary cut
    off would be committed and stand for the history it replaces. At every cap from none of the
    compaction's hold to all of it, each compaction asks for its whole allowance (or the task
    ends ``cost_exceeded`` before it, its figures naming that whole hold)."""
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", WINDOW)

    def run(cap: int) -> tuple[SummarisingModel, Storage, str]:
        model, store = SummarisingModel(docs=10), memory_storage()
        task = store.tasks.create(parse_submission(_submission(max_tokens=cap)), tenant="t")
        _engine(store, model).run(task.task_id)
        return model, store, task.task_id

    model, store, task_id = run(1_000_000)
    steps = [r.body for r in store.steps.load(task_id) if isinstance(r.body, CallStep)]
    k = next(i for i, step in enumerate(steps) if isinstance(step, CompactStep))
    before, whole = sum(step.usage.total for step in steps[:k]), steps[k].reserved_tokens
    allowance = next(r.max_tokens for r in model.requests if _is_compaction(r))
    ended_before = 0
    for cap in (before + whole * j // 24 for j in range(1, 26)):
        model, store, task_id = run(cap)
        assert {r.max_tokens for r in model.requests if _is_compaction(r)} <= {allowance}, cap
        task = store.tasks.get(task_id)
        assert store.budgets.get(task_id).used <= cap
        if task.error and task.error.get("needed_tokens") == whole:  # refused at the compaction, named whole
            ended_before += 1
    assert ended_before > 0


# ---------------------------------------------------------------------- native compaction


def _reads_eight_documents(request: Any) -> Any:
    """The native scenario's model: a tool call a turn with long notes, then an answer."""
    from tests.fake_messages_api import message_reply

    messages = request.body["messages"]
    read = sum(1 for m in messages if isinstance(m["content"], list) for b in m["content"]
               if b.get("type") == "tool_result")  # fmt: skip
    usage = {"input_tokens": len(json.dumps(messages)) // 4, "output_tokens": 50}
    if read >= 8:
        return message_reply([{"type": "text", "text": f"read {read}"}], usage=usage)
    use = {"type": "tool_use", "id": f"toolu_n{read + 1}", "name": "read_doc", "input": {"n": read + 1}}
    return message_reply([{"type": "text", "text": NOTES}, use], stop_reason="tool_use", usage=usage)


def test_native_compaction_keeps_the_servers_block_in_the_step_sends_it_back_and_charges_its_call(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compaction: native``: the request asks for Anthropic's server-side compaction at the
    threshold (beta ``compact-2026-01-12``); the compaction block the server returns is kept in
    the step as it came and sent back with the history; the compaction's own call, reported in
    ``usage.iterations``, is charged with the turn."""
    from tests.fake_messages_api import FakeMessagesAPI, RecordedRequest, point_anthropic_at

    seen: list[RecordedRequest] = []

    def plan(request: RecordedRequest) -> Any:
        seen.append(request)
        return _reads_eight_documents(request)

    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", WINDOW)
    with FakeMessagesAPI(responder=plan) as api:
        point_anthropic_at(api, monkeypatch.setenv)
        task = store.tasks.create(parse_submission(_submission(compaction="native")), tenant="t")
        engine = Engine(store, worker_id="w", tools=ToolRegistry([read_doc]), config=EngineConfig(lease_seconds=30))
        assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
        # The server records a reply's usage once it has written it: the engine can have read the
        # last reply, committed and returned before that thread gets to it on a loaded machine.
        wait_for(lambda: len(api.delivered_usage) == len(seen), what="the server's record of every reply")
        delivered = list(api.delivered_usage)
        requests = [r.body for r in seen]
        beta_headers = {r.headers.get("anthropic-beta") for r in seen}

    steps = store.steps.load(task.task_id)
    assert not any(isinstance(s.body, CompactStep) for s in steps)  # the server compacted, not us
    compacted = [s for s in steps if isinstance(s.body, LLMStep) and s.body.content[0].get("type") == "compaction"]
    assert compacted, "the server never compacted"
    first = compacted[0].body
    assert isinstance(first, LLMStep)
    block = first.content[0]
    assert block["content"].startswith("Compacted summary of") and block["encrypted_content"].startswith("enc:")
    assert beta_headers == {"compact-2026-01-12"}
    assert all(r["context_management"]["edits"][0]["trigger"]["value"] == 3500 for r in requests)
    index = next(i for i, s in enumerate(s for s in steps if isinstance(s.body, LLMStep)) if s in compacted)
    later = requests[index + 1]  # the request after the compacting turn sends the block back as it came
    assert any(m["role"] == "assistant" and m["content"][0] == block for m in later["messages"])

    def total(u: dict[str, Any]) -> int:
        own = int(u["input_tokens"]) + int(u["output_tokens"])
        return own + sum(int(i["input_tokens"]) + int(i["output_tokens"]) for i in u.get("iterations", [])
                         if i["type"] == "compaction")  # fmt: skip

    budget = store.budgets.get(task.task_id)
    assert budget.used == sum(total(u) for u in delivered) and budget.reserved == 0
    assert budget.used <= store.tasks.get(task.task_id).submission.constraints.max_tokens


def test_a_hold_shrunk_near_the_cap_still_covers_the_servers_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Near the cap a call's output allowance shrinks to what is left; a call the server may
    compact first still holds for that compaction (its own read of the context and its summary,
    billed with the turn), so ``used <= cap`` at every cap from where the compacting turn's hold
    cannot be had at all to where it fits whole. Before, the shrunk hold covered the turn's input and
    a short answer only: a cap of 13,000 ended at 15,068 used."""
    from tests.fake_messages_api import FakeMessagesAPI, point_anthropic_at

    def compacted(step: LLMStep) -> bool:
        return bool(step.content) and step.content[0].get("type") == "compaction"

    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", WINDOW)
    with FakeMessagesAPI(responder=_reads_eight_documents, within_max_tokens=True) as api:
        point_anthropic_at(api, monkeypatch.setenv)

        def run(cap: int) -> tuple[Any, list[LLMStep]]:
            store = memory_storage()
            task = store.tasks.create(parse_submission(_submission(compaction="native", max_tokens=cap)), tenant="t")
            engine = Engine(store, worker_id="w", tools=ToolRegistry([read_doc]), config=EngineConfig(lease_seconds=30))
            engine.run(task.task_id)
            steps = [r.body for r in store.steps.load(task.task_id) if isinstance(r.body, LLMStep)]
            return store.budgets.get(task.task_id), steps

        _, free = run(1_000_000)
        k = next(i for i, step in enumerate(free) if compacted(step))
        before, whole = sum(step.usage.total for step in free[:k]), free[k].reserved_tokens
        shrunk = 0
        for cap in (before + whole * j // 24 for j in range(1, 26)):  # none of its hold, to all of it
            budget, steps = run(cap)
            assert budget.used <= budget.cap == cap, (cap, budget)
            shrunk += any(compacted(step) and step.reserved_tokens < whole for step in steps)
    assert shrunk > 0  # the server compacted under a shrunk hold, at some of the caps


def test_native_compaction_needs_anthropic(registry: ToolRegistry) -> None:
    from agentq.control.submit import check_submission

    body = {**_submission(compaction="native"), "provider": "bedrock"}
    with pytest.raises(ValidationError) as refused:
        check_submission(parse_submission(body), registry)
    assert refused.value.field == "constraints.compaction"
