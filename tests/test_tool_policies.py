"""Per-tool permission policies (issue 13.4): ``deny`` is never offered and never runs; ``ask``
pauses the task before the call runs, approve runs it once, reject gives the model the denial
and the tool never runs, also with the worker killed around the decision; a rejected
``request_approval`` stops the calls requested alongside it; a policy naming a tool the task
lacks is refused at submission.

The engine's behaviour runs on the in-memory twin (``store``, ``registry``), a killed worker
being one stopped dead at its crash point (tests/stopped_worker.py) and a decision's requeue a
stand-in queue; an approval's timeout is a message SQS delivers delayed, so those tests run on
moto server (``settings``, ``moto_store``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.engine import Engine, EngineConfig, offered_tools
from agentq.core.errors import ValidationError
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission, ToolsStep
from agentq.core.providers import LLMRequest, LLMResponse, default_provider_factory
from agentq.core.providers.base import max_call_seconds
from agentq.core.tools import ToolRegistry
from agentq.runtime import Settings, build_queues, build_registry, build_store
from agentq.storage.container import Storage
from agentq_dev.moto_server import MotoServer

from tests.helpers import call, deployment, scripted
from tests.stopped_worker import resume, stopped_at

STORAGE = "memory"  # the engine's behaviour; moto server for the approval timer's delayed message

CHARGE = [
    {
        "text": "charging",
        "tool_calls": [call("lookup", query="price"), call("charge_card", amount_cents=500, memo="x")],
    },
    {"text": "finished"},
]


def _with_policies(turns: list[Any], tools: list[str], **policies: str) -> TaskSubmission:
    body = scripted(turns, tools=tools).model_dump()
    body["constraints"]["tool_policies"] = policies
    return TaskSubmission.model_validate(body)


def _charges(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


@pytest.fixture
def settings(moto_server: MotoServer) -> Settings:
    """Table, bucket and queues (an approval's timer is a delayed message) under a prefix of its own."""
    return deployment(moto_server)  # type: ignore[no-any-return]


@pytest.fixture
def moto_store(settings: Settings) -> Storage:
    return build_store(settings)


@pytest.fixture
def moto_registry(settings: Settings) -> ToolRegistry:
    return build_registry(settings)


class _Queues:
    """Stands in for TaskQueues where a decision requeues the task: the test runs it itself."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, task_id: str, priority: Any, **_: Any) -> None:
        self.sent.append(task_id)


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(path))
    return path


def _engine(store: Storage, registry: ToolRegistry, **kwargs: Any) -> Engine:
    return Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=5), **kwargs)


def _results(store: Storage, task_id: str) -> dict[str, Any]:
    return {r.name: r for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep) for r in s.body.results}


def test_a_denied_tool_is_never_offered_to_the_model_and_a_call_to_it_never_runs(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    sub = _with_policies(CHARGE, ["lookup", "charge_card"], charge_card="deny")
    assert offered_tools(sub.constraints) == ["lookup"]
    task = store.tasks.create(sub, tenant="t")
    offered: list[list[str]] = []

    def provider(submission: TaskSubmission) -> Any:
        inner = default_provider_factory(submission)

        class _Recording:
            name = inner.name

            def complete(self, request: LLMRequest) -> LLMResponse:
                offered.append([t["name"] for t in request.tools])
                return inner.complete(request)

        return _Recording()

    assert _engine(store, registry, providers=provider).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert offered and all(names == ["lookup"] for names in offered)
    denied = _results(store, task.task_id)["charge_card"]
    assert denied.is_error and _charges(ledger) == []


def test_an_ask_tool_pauses_before_it_runs_and_runs_once_when_approved(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    from agentq.control.operations import decide

    task = store.tasks.create(_with_policies(CHARGE, ["lookup", "charge_card"], charge_card="ask"), tenant="t")
    assert _engine(store, registry).run(task.task_id).status is TaskStatus.PAUSED
    pending = store.approvals.pending(task.task_id)
    assert pending is not None and pending.question == 'Run charge_card with {"amount_cents": 500, "memo": "x"}?'
    assert _charges(ledger) == [] and store.steps.load(task.task_id)[-1].number == 1  # nothing ran yet
    queues = _Queues()
    decide(store, queues, task.task_id, approved=True, note="ok", by="alice")  # type: ignore[arg-type]
    assert queues.sent == [task.task_id]  # requeued to run the decision
    assert _engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert len(_charges(ledger)) == 1 and not _results(store, task.task_id)["charge_card"].is_error


def test_an_ask_tool_rejected_never_runs_and_the_model_reads_the_denial(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    from agentq.control.operations import decide

    task = store.tasks.create(_with_policies(CHARGE, ["lookup", "charge_card"], charge_card="ask"), tenant="t")
    _engine(store, registry).run(task.task_id)
    decide(store, _Queues(), task.task_id, approved=False, note="too much", by="bob")  # type: ignore[arg-type]
    assert _engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    results = _results(store, task.task_id)
    assert results["charge_card"].is_error and results["charge_card"].content == (
        "REJECTED by bob: too much; charge_card was not run"
    )
    assert not results["lookup"].is_error  # an allowed call of the same turn runs
    assert _charges(ledger) == []


def test_a_rejected_request_approval_stops_the_calls_requested_alongside_it(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    from agentq.control.operations import decide

    turns = [
        {"text": "", "tool_calls": [call("request_approval", question="charge?"), call("charge_card", amount_cents=1, memo="m")]},
        {"text": "stopped"},
    ]  # fmt: skip
    task = store.tasks.create(scripted(turns, tools=["request_approval", "charge_card"]), tenant="t")
    assert _engine(store, registry).run(task.task_id).status is TaskStatus.PAUSED
    decide(store, _Queues(), task.task_id, approved=False, note="no", by="carol")  # type: ignore[arg-type]
    assert _engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    results = _results(store, task.task_id)
    assert results["request_approval"].content.startswith("REJECTED by carol")
    assert results["charge_card"].is_error and "not run: the approval asked for in this turn was rejected" in (
        results["charge_card"].content
    )
    assert _charges(ledger) == []


def test_a_policy_for_a_tool_the_task_lacks_is_refused_naming_it(store: Storage, registry: ToolRegistry) -> None:
    sub = _with_policies(CHARGE, ["lookup"], charge_card="ask")
    queues = _Queues()
    with pytest.raises(ValidationError) as refused:
        submit(store, registry, sub, tenant="t", queues=queues)  # type: ignore[arg-type]
    assert refused.value.field == "constraints.tool_policies.charge_card"
    with pytest.raises(ValueError):
        _with_policies(CHARGE, ["lookup"], lookup="sometimes")
    assert store.tasks.list_for_tenant("t", limit=5)[0] == [] and queues.sent == []  # nothing written or sent


@pytest.mark.parametrize(
    ("approved", "crash_at", "charges"),
    [
        (False, "after_claim:1", 0),  # killed right after claiming the resumed task: still never runs
        (False, "after_tools_commit:1", 0),  # killed after committing the denial
        (True, "after_tool_run:1", 1),  # killed after the approved charge ran, before it was recorded
        (True, "after_effect_begin:1", 0),  # killed before the charge ran: outcome unknown, never re-run
    ],
)
def test_a_decision_holds_when_the_worker_is_killed_around_it(
    store: Storage, registry: ToolRegistry, ledger: Path, monkeypatch: pytest.MonkeyPatch,
    approved: bool, crash_at: str, charges: int,
) -> None:  # fmt: skip
    """Each worker as ``agentq run-task --lease 1`` runs it; the killed one stops dead at its
    crash point (tests/stopped_worker.py) and its successor waits out its lease."""
    from agentq.control.operations import decide

    def worker(name: str) -> Engine:
        config = EngineConfig(lease_seconds=1, max_call_seconds=max_call_seconds())
        return Engine(store, worker_id=name, tools=registry, config=config)

    task = store.tasks.create(_with_policies(CHARGE, ["lookup", "charge_card"], charge_card="ask"), tenant="t")
    assert resume(worker("first"), task.task_id, wait_seconds=0).status is TaskStatus.PAUSED
    decide(store, _Queues(), task.task_id, approved=approved, note="n", by="dana")  # type: ignore[arg-type]
    with stopped_at(worker("killed"), task.task_id, crash_at, monkeypatch):
        resumed = resume(worker("resumed"), task.task_id, wait_seconds=20)  # once the killed one's lease lapses
        assert resumed.status is TaskStatus.SUCCEEDED, resumed
    final = store.tasks.get(task.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "finished"
    assert len(_charges(ledger)) == charges
    result = _results(store, task.task_id)["charge_card"]
    assert result.is_error is (not approved or charges == 0)
    assert sum(isinstance(s.body, LLMStep) for s in store.steps.load(task.task_id)) == 2


def test_a_sub_agent_inherits_the_policies_of_the_tools_it_gets(store: Storage) -> None:
    from agentq.core.fanout import SpawnInput, plan_children

    parent = store.tasks.create(
        _with_policies(CHARGE, ["lookup", "charge_card", "spawn_subagents"], charge_card="ask", lookup="deny"),
        tenant="t",
    )
    spec = SpawnInput.model_validate({"subagents": [
        {"goal": "a", "tools": ["charge_card"], "script": {"turns": [{"text": "x"}]}},
        {"goal": "b", "script": {"turns": [{"text": "y"}]}},
    ]})  # fmt: skip
    first, second = plan_children(parent, "toolu_1", spec, available=10_000)
    assert first.submission.constraints.tool_policies == {"charge_card": "ask"}
    assert second.submission.constraints.tool_policies == {"charge_card": "ask", "lookup": "deny"}


def _receive(settings: Settings, kind: str, timeout: float = 15) -> str:
    """The body of the next message of ``kind`` on the normal queue (others are dropped)."""
    from agentq.queueing.queues import TaskMessage

    from tests.helpers import wait_for

    queues = build_queues(settings)

    def one() -> str | None:
        for m in queues.sqs.receive_message(QueueUrl=queues.url("normal"), WaitTimeSeconds=1).get("Messages", []):
            queues.sqs.delete_message(QueueUrl=queues.url("normal"), ReceiptHandle=m["ReceiptHandle"])
            if TaskMessage.model_validate_json(m["Body"]).kind == kind:
                return str(m["Body"])
        return None

    return str(wait_for(one, timeout=timeout, what=f"a {kind} message"))


@pytest.mark.parametrize(("default", "charges"), [("reject", 0), ("approve", 1)])
def test_an_approval_undecided_past_its_timeout_takes_the_default_decision(
    moto_store: Storage, moto_registry: ToolRegistry, ledger: Path, settings: Settings, default: str, charges: int
) -> None:
    from agentq.runtime import build_dispatcher

    store, registry = moto_store, moto_registry
    sub = _with_policies(CHARGE, ["lookup", "charge_card"], charge_card="ask")
    sub = sub.model_copy(
        update={
            "constraints": sub.constraints.model_copy(
                update={"approval_timeout_seconds": 2, "approval_default": default}
            )
        }
    )
    task = store.tasks.create(sub, tenant="t")
    dispatcher = build_dispatcher(_engine(store, registry), store, build_queues(settings), max_receive_count=5)
    first = dispatcher.handle(json.dumps({"task_id": task.task_id}), tier="normal", receive_count=1)
    assert first.run is not None and first.run.status is TaskStatus.PAUSED
    due = _receive(settings, "approval_due")  # sent delayed by the timeout: the task holds no worker meanwhile
    assert store.tasks.get(task.task_id).status is TaskStatus.PAUSED
    dispatcher.handle(due, tier="normal", receive_count=1)
    final = store.tasks.get(task.task_id)
    assert final.status is TaskStatus.SUCCEEDED
    [decided] = store.approvals.list(task.task_id)
    assert decided.decided_by == "timeout" and decided.state == ("approved" if default == "approve" else "rejected")
    assert len(_charges(ledger)) == charges
    result = _results(store, task.task_id)["charge_card"]
    assert result.is_error is (default == "reject")
    if default == "reject":
        assert result.content.startswith("REJECTED by timeout: no decision within 2s")


def test_a_person_who_decides_before_the_timeout_wins_and_the_timer_changes_nothing(
    moto_store: Storage, moto_registry: ToolRegistry, ledger: Path, settings: Settings
) -> None:
    from agentq.control.operations import decide
    from agentq.runtime import build_dispatcher

    store, registry = moto_store, moto_registry
    sub = _with_policies(CHARGE, ["lookup", "charge_card"], charge_card="ask")
    sub = sub.model_copy(update={"constraints": sub.constraints.model_copy(update={"approval_timeout_seconds": 2})})
    task = store.tasks.create(sub, tenant="t")
    queues = build_queues(settings)
    dispatcher = build_dispatcher(_engine(store, registry), store, queues, max_receive_count=5)
    dispatcher.handle(json.dumps({"task_id": task.task_id}), tier="normal", receive_count=1)
    decide(store, queues, task.task_id, approved=True, note="go", by="erin")
    due = _receive(settings, "approval_due")
    action = dispatcher.handle(due, tier="normal", receive_count=1)
    assert action.kind == "delete" and action.run is None  # the timer found nothing pending
    dispatcher.handle(json.dumps({"task_id": task.task_id}), tier="normal", receive_count=1)
    assert store.tasks.get(task.task_id).status is TaskStatus.SUCCEEDED
    [decided] = store.approvals.list(task.task_id)
    assert decided.decided_by == "erin" and len(_charges(ledger)) == 1
