"""The engine's storage calls and crash points, pinned: a restructuring must not change them.

Each scenario runs the engine on the in-memory storage behind a recording wrapper
(``tests/engine_recording.py``) and compares every port call and crash point it logged, in
order, with ``tests/golden/engine/<scenario>.txt``. The lines were recorded from the engine
before it became a package of turns; a difference means the writes or their order changed, and
must be explained in the commit that changes the file (``AGENTQ_UPDATE_GOLDEN=1`` rewrites
them). The heartbeat is left out (a no-op keeper): its beats depend on the clock.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig, RunResult
from agentq.core.errors import ProviderError
from agentq.core.models import Lease, Task, TaskStatus, TaskSubmission
from agentq.core.providers import LLMRequest, LLMResponse
from agentq.core.providers.base import RetryNotice, report_retry
from agentq.core.providers.scripted import ScriptedProvider
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage, memory_storage

from tests.engine_recording import Recorder, RecordingStorage, record_crash_points
from tests.helpers import call, scripted

GOLDEN = Path(__file__).parent / "golden" / "engine"
NOTES = "n" * 800  # ~200 output tokens a turn by the scripted provider's count


class Harness:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, registry: ToolRegistry) -> None:
        monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(tmp_path / "ledger.jsonl"))
        self.recorder = Recorder()
        record_crash_points(monkeypatch, self.recorder)
        self.raw: Storage = memory_storage()
        self.store = RecordingStorage(self.raw, self.recorder)
        self.registry = registry
        self.providers: Callable[[TaskSubmission], Any] | None = None
        self.fanout: Any = None

    def create(self, submission: TaskSubmission | dict[str, Any]) -> Task:
        sub = submission if isinstance(submission, TaskSubmission) else TaskSubmission.model_validate(submission)
        return self.raw.tasks.create(sub, tenant="t")

    def run(self, task_id: str, worker: str = "w1", **kwargs: Any) -> RunResult:
        extra: dict[str, Any] = {}
        if self.providers is not None:
            extra["providers"] = self.providers
        engine = Engine(
            self.store,  # type: ignore[arg-type]
            worker_id=worker,
            tools=self.registry,
            config=EngineConfig(lease_seconds=30),
            fanout=self.fanout,
            **extra,
        )
        result = engine.run(task_id, keeper=lambda _: contextlib.nullcontext(), **kwargs)
        self.recorder.note(
            f"== run {self.recorder.alias(task_id)} by {worker}: {result.outcome} "
            f"{result.status.value if result.status else '-'} "
            f"{(result.error or {}).get('code', '')} committed={result.steps_committed}"
        )
        return result

    def check(self, scenario: str) -> None:
        path = GOLDEN / f"{scenario}.txt"
        text = "\n".join(self.recorder.lines) + "\n"
        if os.environ.get("AGENTQ_UPDATE_GOLDEN") == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        assert path.exists(), f"no recording for {scenario}: run with AGENTQ_UPDATE_GOLDEN=1 once"
        expected = path.read_text().splitlines()
        got = text.splitlines()
        for i, (want, have) in enumerate(zip(expected, got, strict=False)):
            assert want == have, f"{scenario}: line {i + 1} differs\n  recorded: {want}\n  now:      {have}"
        assert len(expected) == len(got), f"{scenario}: {len(expected)} lines recorded, {len(got)} now"


@pytest.fixture
def h(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, memory_registry: ToolRegistry) -> Iterator[Harness]:
    yield Harness(monkeypatch, tmp_path, memory_registry)


def _wrapped(turns: list[Any], around: Callable[[int, LLMRequest, ScriptedProvider], LLMResponse]) -> Any:
    """A provider factory whose calls go through ``around(call_number, request, scripted)``."""
    from agentq.core.models import Script

    calls = [0]

    def factory(submission: TaskSubmission) -> Any:
        inner = ScriptedProvider(Script.model_validate({"turns": turns}))

        class Provider:
            name = "anthropic"

            def complete(self, request: LLMRequest) -> LLMResponse:
                calls[0] += 1
                return around(calls[0], request, inner)

        return Provider()

    return factory


def _anthropic(turns: list[Any], **constraints: Any) -> dict[str, Any]:
    """A submission for a real provider name (flow control applies), answered by a script."""
    return {"goal": "test goal", "provider": "anthropic", "model": "claude-sonnet-4-5",
            "constraints": {"tools": ["lookup", "charge_card"], **constraints}}  # fmt: skip


THREE_TURNS = [
    {"text": "looking", "tool_calls": [call("lookup", query="a")]},
    {"text": "charging", "tool_calls": [call("charge_card", amount_cents=500, memo="m"), call("lookup", query="b")]},
    {"text": "all done"},
]


def test_three_turns_with_a_side_effect(h: Harness) -> None:
    task = h.create(scripted(THREE_TURNS, tools=["lookup", "charge_card"]))
    assert h.run(task.task_id).status is TaskStatus.SUCCEEDED
    h.check("three_turns_with_a_side_effect")


def test_a_budget_shrink_then_cost_exceeded(h: Harness) -> None:
    turns = [{"text": f"turn {i} {NOTES}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(10)]
    task = h.create(scripted(turns, tools=["lookup"], max_tokens=3_200, max_output_tokens=1_000))
    result = h.run(task.task_id)
    assert result.status is TaskStatus.COST_EXCEEDED, result
    assert any("budgets.reserve" in line for line in h.recorder.lines)
    h.check("budget_shrink_then_cost_exceeded")


def test_a_money_cap(h: Harness) -> None:
    turns = [{"text": f"turn {i} {NOTES}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(10)]
    task = h.create(
        scripted(
            turns, tools=["lookup"], max_steps=100, max_output_tokens=500, max_tokens=2_000_000, max_cost_usd="0.015"
        )
    )
    result = h.run(task.task_id)
    assert result.status is TaskStatus.COST_EXCEEDED and result.error is not None, result
    assert "money" in result.error["message"]
    h.check("money_cap")


def test_a_lambda_time_slice(h: Harness) -> None:
    margin = EngineConfig().slice_margin_seconds
    deadline = time.time() + margin + 0.5

    def slow_first(n: int, request: LLMRequest, inner: ScriptedProvider) -> LLMResponse:
        while n == 1 and time.time() < deadline - margin:  # the slice's end passes during the first call
            time.sleep(0.02)
        return inner.complete(request)

    h.providers = _wrapped(THREE_TURNS, slow_first)
    task = h.create(_anthropic(THREE_TURNS))
    assert h.run(task.task_id, deadline=deadline).outcome == "continue"
    assert h.run(task.task_id, worker="w2").status is TaskStatus.SUCCEEDED
    h.check("lambda_time_slice")


def test_an_approval_pause_and_decision(h: Harness) -> None:
    turns = [
        {"text": "asking", "tool_calls": [call("request_approval", question="charge 5 dollars?")]},
        {"text": "charging", "tool_calls": [call("charge_card", amount_cents=500, memo="x")]},
        {"text": "done"},
    ]
    task = h.create(scripted(turns, tools=["request_approval", "charge_card"], approval_timeout_seconds=600))
    assert h.run(task.task_id).status is TaskStatus.PAUSED
    pending = h.raw.approvals.pending(task.task_id)
    assert pending is not None
    h.raw.approvals.decide(task.task_id, pending.use_id, approved=True, note="ok", by="alice")
    assert h.run(task.task_id, worker="w2").status is TaskStatus.SUCCEEDED
    h.check("approval_pause_and_decision")


def test_a_tool_policy_ask_rejected(h: Harness) -> None:
    turns = [
        {
            "text": "charging",
            "tool_calls": [call("lookup", query="price"), call("charge_card", amount_cents=5, memo="x")],
        },
        {"text": "finished"},
    ]
    body = scripted(turns, tools=["lookup", "charge_card"]).model_dump()
    body["constraints"]["tool_policies"] = {"charge_card": "ask"}
    task = h.create(body)
    assert h.run(task.task_id).status is TaskStatus.PAUSED
    pending = h.raw.approvals.pending(task.task_id)
    assert pending is not None
    h.raw.approvals.decide(task.task_id, pending.use_id, approved=False, note="no", by="bob")
    assert h.run(task.task_id, worker="w2").status is TaskStatus.SUCCEEDED
    h.check("tool_policy_ask_rejected")


class RecordingFanout:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def start(self, *, parent: Task, spawn_id: str, children: list[Any], max_concurrency: int) -> str:
        self.recorder.note(f"fanout.start({self.recorder.alias(parent.task_id)}, {len(children)} children)")
        return "arn:aws:states:local:000000000000:execution:fanout:1"

    def child_finished(self, task_token: str, task_id: str, status: TaskStatus) -> None:
        raise AssertionError("the engine never reports a child's end itself")


def test_a_spawn_and_wake(h: Harness) -> None:
    child = {"turns": [{"text": "child looks", "tool_calls": [call("lookup", query="c")]}, {"text": "child done"}]}
    turns = [
        {"text": "splitting", "tool_calls": [call("spawn_subagents", subagents=[
            {"goal": "one", "tools": ["lookup"], "script": child},
            {"goal": "two", "tools": ["lookup"], "script": child},
        ])]},
        {"text": "both done"},
    ]  # fmt: skip
    h.fanout = RecordingFanout(h.recorder)
    task = h.create(scripted(turns, tools=["spawn_subagents", "lookup"]))
    assert h.run(task.task_id).status is TaskStatus.WAITING
    record = h.raw.spawns.get(task.task_id, h.raw.steps.load(task.task_id)[-1].body.tool_uses()[0]["id"])  # type: ignore[union-attr]
    assert record is not None
    for child_id in record.children:
        assert h.run(child_id, worker="w3").status is TaskStatus.SUCCEEDED
    h.raw.spawns.mark(task.task_id, record.spawn_id, woken=True)  # what the fan-out's end does
    h.raw.tasks.transition(task.task_id, TaskStatus.QUEUED)
    assert h.run(task.task_id, worker="w2").status is TaskStatus.SUCCEEDED
    h.check("spawn_and_wake")


def test_an_economy_batch(h: Harness) -> None:
    from agentq.core.models import Script

    turns = [{"text": "looking", "tool_calls": [call("lookup", query="a")]}, {"text": "all done"}]
    sent: dict[str, LLMRequest] = {}

    class Batches:
        name = "anthropic"

        def __init__(self) -> None:
            self.inner = ScriptedProvider(Script.model_validate({"turns": turns}))

        def complete(self, request: LLMRequest) -> LLMResponse:
            raise AssertionError("an economy task's calls go through batches")

        def submit_batch(self, request: LLMRequest, custom_id: str) -> str:
            sent[f"batch_{len(sent) + 1}"] = request
            return f"batch_{len(sent)}"

        def batch_result(self, batch_id: str, custom_id: str) -> LLMResponse | None:
            return self.inner.complete(sent[batch_id])

    h.providers = lambda _: Batches()
    task = h.create(_anthropic(turns, economy=True, max_cost_usd="1"))
    for worker in ("w1", "w2", "w3", "w4"):
        result = h.run(task.task_id, worker=worker)
        if result.outcome == "finished":
            break
        assert result.outcome == "waiting"
        h.raw.tasks.transition(task.task_id, TaskStatus.QUEUED)  # what the poll message does
    assert result.status is TaskStatus.SUCCEEDED
    h.check("economy_batch")


def test_a_compaction(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", '{"claude-sonnet-4-6": 2000}')
    turns = [
        {"text": "first", "tool_calls": [call("lookup", query="a", size=4000)]},
        {"text": "second", "tool_calls": [call("lookup", query="b", size=4000)]},
        {"text": "all read"},
    ]
    task = h.create(scripted(turns, tools=["lookup"], context_threshold=0.5, keep_tool_results=1))
    assert h.run(task.task_id).status is TaskStatus.SUCCEEDED
    assert any("compact" in line for line in h.recorder.lines)
    h.check("compaction")


def test_a_429_retried_in_the_call_then_failing_it(h: Harness) -> None:
    def flaky(n: int, request: LLMRequest, inner: ScriptedProvider) -> LLMResponse:
        if n == 1:
            report_retry(RetryNotice(attempt=1, max_attempts=3, code="rate_limited", message="429 Too Many Requests",
                                     status_code=429, delay=0.0, unbilled=True))  # fmt: skip
            return inner.complete(request)
        raise ProviderError("rate limited (429)", retryable=True, status_code=429, attempts=3, code="rate_limited",
                            retry_after=2.0)  # fmt: skip

    h.providers = _wrapped(THREE_TURNS, flaky)
    task = h.create(_anthropic(THREE_TURNS))
    assert h.run(task.task_id).outcome == "retry"
    assert h.run(task.task_id, worker="w2").outcome == "deferred"  # the fleet slows down for the retry-after
    h.check("retry_429")


def test_a_lost_lease(h: Harness) -> None:
    def taken_over(n: int, request: LLMRequest, inner: ScriptedProvider) -> LLMResponse:
        if n == 2:  # while the second call is in flight another worker takes the task over
            task = h.raw.tasks.get(request.task_id or "")
            mine = Lease(task_id=task.task_id, owner="w1", epoch=task.lease_epoch, expires_at=0)
            h.raw.tasks.release(mine)
            assert h.raw.tasks.claim(task.task_id, "rival", 30) is not None
        return inner.complete(request)

    h.providers = _wrapped(THREE_TURNS, taken_over)
    task = h.create(_anthropic(THREE_TURNS))
    assert h.run(task.task_id).outcome == "lease_lost"
    h.check("lost_lease")
