"""A tool_use id a later turn uses again never carries an earlier call's approval, effect record
or spawn to the new call (``core.call_keys``). The engine refuses a turn that gives one id to two
calls (tests/test_repeated_tool_use_ids.py), but an OpenAI-compatible server or a gateway that
passes the model's own ids through may reuse one across turns, and one that numbers each reply's
calls gives ``call_0`` to every turn's first call. Found by id alone, the end user's approval of a
harmless ``request_approval`` decided a 50,000-cent charge a tenant-only rule held; a model call
id spelling a soft threshold's approval id passed the tenant's threshold on the user's approval;
a second charge under an old id "replayed" the first one's result and never ran; a second spawn
under an old id answered with the first spawn's children.

The real engine on the moto server, with a fake provider choosing the ids (the threat), and the
ledger tool of tests/effect_tools.py counting real charges. Each attack has its control (a new
id), and a record written before records named their call (a task in flight at the deploy) is
still read as its own call's, never as a later one's."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from agentq.api.task_view import task_view
from agentq.cli.views import held_call
from agentq.control import operations
from agentq.core.caps import CapLimits, approval_id, day_key
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import IllegalTransition
from agentq.core.models import LLMStep, Task, TaskStatus, TaskSubmission, ToolsStep, Usage
from agentq.core.policies import check
from agentq.core.providers import LLMRequest, LLMResponse, default_provider_factory
from agentq.core.tools import ToolRegistry
from agentq.queueing.stepfunctions import execution_name
from agentq.runtime import build_fanout, build_registry, build_store
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.table import Update

from tests.helpers import deployment

RULE = """@id("big-charges") @effect("ask")
@message("charges above 100 need the operator's approval")
forbid(principal, action == Action::"tool", resource == Tool::"charge_card")
when { context.args has amount_cents && context.args.amount_cents > 100 };"""
SAME = "call_0"  # what a server that numbers its calls per reply gives every turn's first call
BIG = 50_000


class _Turns:
    """A provider answering each turn with the tool calls given for it (``(id, name, input)``),
    then ``done``."""

    name = "scripted"

    def __init__(self, *turns: list[tuple[str, str, dict[str, Any]]]) -> None:
        self.turns, self.asked = list(turns), 0

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.asked += 1
        usage = Usage(input_tokens=10, output_tokens=5)
        if self.asked > len(self.turns):
            return LLMResponse(content=[{"type": "text", "text": "done"}], stop_reason="end_turn",
                               model=request.model, usage=usage)  # fmt: skip
        content = [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in self.turns[self.asked - 1]]
        return LLMResponse(content=content, stop_reason="tool_use", model=request.model, usage=usage)


class _Queues:
    def send(self, *args: Any, **kwargs: Any) -> None:
        pass


def _decide(store: Storage, task_id: str, **by: Any) -> None:
    """A person's decision, as the API takes it (the task's message is the test's to run)."""
    operations.decide(store, _Queues(), task_id, approved=True, by="acme", tenant="acme", **by)  # type: ignore[arg-type]


def _engine(store: Storage, registry: ToolRegistry, model: Any, **kwargs: Any) -> Engine:
    """``model`` answers the task's turns; a sub-agent's, its own script."""

    def providers(sub: TaskSubmission) -> Any:
        return model if sub.goal == "refund" else default_provider_factory(sub)

    return Engine(store, worker_id="w", tools=registry, providers=providers,
                  config=EngineConfig(lease_seconds=30, policy_cache_seconds=0), **kwargs)  # fmt: skip


def _task(store: Storage, tools: list[str], **constraints: Any) -> Task:
    sub = TaskSubmission.model_validate({
        "goal": "refund", "provider": "scripted", "script": {"turns": [{"text": "-"}]}, "user": "mallory",
        "constraints": {"tools": tools, **constraints},
    })  # fmt: skip
    return store.tasks.create(sub, tenant="acme")


def _charges(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(path))
    return path


QUESTION = ("request_approval", {"question": "may I look up your order?"})
CHARGE = ("charge_card", {"amount_cents": BIG, "memo": "refund"})


@pytest.mark.parametrize("reuse", [True, False], ids=["id-reused", "control-new-id"])
def test_an_approval_the_user_gave_under_one_id_never_decides_a_later_call_a_tenant_rule_holds(
    store: Storage, registry: ToolRegistry, ledger: Path, reuse: bool
) -> None:
    store.policies.put("acme", "tenant", RULE, check(RULE).digest)
    task = _task(store, ["charge_card", "request_approval"])
    model = _Turns([(SAME, *QUESTION)], [(SAME if reuse else "call_1", *CHARGE)])
    engine = _engine(store, registry, model)
    assert engine.run(task.task_id).status is TaskStatus.PAUSED
    # The end user's own token approves its own harmless question (it may: approver "user").
    _decide(store, task.task_id, by_user="mallory")
    result = engine.run(task.task_id)
    assert [c for c in _charges(ledger) if c["amount"] == BIG] == [], "a charge ran on another call's approval"
    assert result.status is TaskStatus.PAUSED
    pending = store.approvals.pending(task.task_id)
    assert pending is not None and pending.approver == "tenant" and pending.tool == "charge_card"
    assert pending.use_id == (f"agentq-3-{SAME}" if reuse else "call_1")  # its own key, beside the question's
    # The tenant approves it: the charge runs once, and the task ends.
    _decide(store, task.task_id)
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    assert [c["amount"] for c in _charges(ledger)] == [BIG]


def test_an_approval_asked_before_records_named_their_call_is_not_carried_to_a_later_call_either(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    """A task in flight at the deploy: its question's approval was asked and decided with no step
    on its record. A later turn's call under that id is asked for again, never decided by it."""
    store.policies.put("acme", "tenant", RULE, check(RULE).digest)
    task = _task(store, ["charge_card", "request_approval"])
    engine = _engine(store, registry, _Turns([(SAME, *QUESTION)], [(SAME, *CHARGE)]))
    assert engine.run(task.task_id).status is TaskStatus.PAUSED
    asked = keys.item_key(task.task_id, f"{keys.APPROVAL}{SAME}")
    store.table.update(asked, Update(remove=("step", "tool")))  # as records were asked before
    assert {"step", "tool"}.isdisjoint(store.table.get(asked) or {"step": "gone"})
    _decide(store, task.task_id, by_user="mallory")
    assert engine.run(task.task_id).status is TaskStatus.PAUSED
    assert _charges(ledger) == []
    pending = store.approvals.pending(task.task_id)
    assert pending is not None and pending.approver == "tenant" and pending.use_id == f"agentq-3-{SAME}"


@pytest.mark.parametrize("reuse", [True, False], ids=["id-reused", "control-new-id"])
def test_the_view_marks_the_held_call_among_the_turns_calls_and_a_decision_naming_it_decides_it(
    store: Storage, registry: ToolRegistry, ledger: Path, reuse: bool
) -> None:
    """``pending_calls`` lists the model's ids; ``pending_tool_use_id`` is the name a decision
    sends, the held call's record key (``agentq-3-call_0`` for a reused id). The listed call it
    names is marked ``held``, so the console's "this decision" and ``agentq approve``'s ``->``
    mark it; before, no listed call equalled the key and nothing was marked."""
    store.policies.put("acme", "tenant", RULE, check(RULE).digest)
    task = _task(store, ["charge_card", "request_approval"])
    engine = _engine(store, registry, _Turns([(SAME, *QUESTION)], [(SAME if reuse else "call_1", *CHARGE)]))
    assert engine.run(task.task_id).status is TaskStatus.PAUSED
    _decide(store, task.task_id, by_user="mallory")
    assert engine.run(task.task_id).status is TaskStatus.PAUSED  # now holding the charge
    view = task_view(store, store.tasks.get(task.task_id))
    assert [(c.tool_use_id, c.name) for c in view.pending_calls if c.held] == [(SAME if reuse else "call_1", CHARGE[0])]
    assert view.pending_tool_use_id == (f"agentq-3-{SAME}" if reuse else "call_1")
    assert "-> charge_card" in held_call(view)
    _decide(store, task.task_id, tool_use_id=view.pending_tool_use_id)
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    assert [c["amount"] for c in _charges(ledger)] == [BIG]


def test_a_decision_naming_a_reused_id_never_decides_the_later_call_and_says_the_name_it_holds_by(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    """``call_0`` names two calls once the model reuses it: the question (decided) and the held
    charge. A decision naming ``call_0`` may be a double click on the question, so it decides
    nothing (mapping it to the held call would approve a charge nobody was shown); its 409 says
    the held call is the one the model gave ``call_0`` again, and the name a decision of it sends."""
    store.policies.put("acme", "tenant", RULE, check(RULE).digest)
    task = _task(store, ["charge_card", "request_approval"])
    engine = _engine(store, registry, _Turns([(SAME, *QUESTION)], [(SAME, *CHARGE)]))
    assert engine.run(task.task_id).status is TaskStatus.PAUSED
    _decide(store, task.task_id, by_user="mallory", tool_use_id=SAME)
    assert engine.run(task.task_id).status is TaskStatus.PAUSED
    with pytest.raises(IllegalTransition) as refused:
        _decide(store, task.task_id, tool_use_id=SAME)
    message = refused.value.message
    assert refused.value.field == "tool_use_id" and "approved already" in message, message
    assert f"'agentq-3-{SAME}'" in message and f"gave the id '{SAME}' again" in message, message
    pending = store.approvals.pending(task.task_id)
    assert pending is not None and pending.use_id == f"agentq-3-{SAME}" and _charges(ledger) == []


@pytest.mark.parametrize("colliding", [True, False], ids=["id-of-the-cap-approval", "control-other-id"])
def test_a_users_approval_of_a_model_question_never_passes_the_tenants_soft_threshold(
    store: Storage, registry: ToolRegistry, colliding: bool
) -> None:
    """A soft threshold is the tenant's to approve (approver: tenant). A model whose tool_use id
    was the soft threshold's approval id had its end user's approval of a question counted as
    the tenant's approval to go past the line. The old spelling of the id is tried too."""
    store.caps.put("acme", "user", "mallory", CapLimits(daily_tokens=1_000_000, soft_daily_tokens=4_000))
    task = _task(store, ["request_approval"], max_tokens=1_000_000, max_output_tokens=200)
    today = approval_id("user", "day", day_key(time.time()))
    model = _Turns([(today if colliding else "toolu_question", *QUESTION)])
    engine = _engine(store, registry, model)
    assert engine.run(task.task_id).status is TaskStatus.PAUSED
    _decide(store, task.task_id, by_user="mallory")
    # Meanwhile another task of mallory's spent 5,000 tokens today (its tenant let it past the line).
    cap = store.caps.get("acme", "user", "mallory")
    assert cap is not None
    other = store.caps.hold([cap], 5_000, approved=frozenset({today}))
    store.caps.settle(other, 5_000)
    assert store.caps.usage("acme", "user", "mallory")["day_tokens"] > 4_000  # past the soft line
    result = engine.run(task.task_id)
    assert model.asked == 1, "the model was called past the soft threshold without the tenant's approval"
    assert result.status is TaskStatus.PAUSED
    pending = store.approvals.pending(task.task_id)
    assert pending is not None and pending.approver == "tenant" and pending.use_id == today


def test_a_model_id_spelling_the_old_soft_threshold_id_is_not_keyed_under_it(
    store: Storage, registry: ToolRegistry
) -> None:
    """Ids agentq names itself (``agentq-``, ``grade-``, ``cap-``: a threshold's approval asked
    before the move) are never a call's key: such a call's records go under its qualified key."""
    task = _task(store, ["request_approval"])
    old = f"cap-user-day-{day_key(time.time())}"
    assert _engine(store, registry, _Turns([(old, *QUESTION)])).run(task.task_id).status is TaskStatus.PAUSED
    assert store.approvals.get(task.task_id, old) is None
    pending = store.approvals.pending(task.task_id)
    assert pending is not None and pending.use_id == f"agentq-1-{old}"


@pytest.mark.parametrize("reuse", [True, False], ids=["id-reused", "control-new-id"])
def test_a_side_effecting_call_under_an_earlier_calls_id_runs_instead_of_replaying_that_calls_result(
    store: Storage, registry: ToolRegistry, ledger: Path, reuse: bool
) -> None:
    task = _task(store, ["charge_card"])
    model = _Turns([(SAME, "charge_card", {"amount_cents": 11, "memo": "one"})],
                   [(SAME if reuse else "call_1", "charge_card", {"amount_cents": 22, "memo": "two"})])  # fmt: skip
    assert _engine(store, registry, model).run(task.task_id).status is TaskStatus.SUCCEEDED
    charges = _charges(ledger)
    assert [c["amount"] for c in charges] == [11, 22], "the second charge replayed the first one's result"
    assert charges[0]["key"] != charges[1]["key"]  # each call its own idempotency key
    second = store.steps.load(task.task_id)[3].body
    assert isinstance(second, ToolsStep) and second.results[0].status == "ok"
    assert second.results[0].tool_use_id == (SAME if reuse else "call_1")  # the model reads its own id back
    effect = store.effects.get(task.task_id, f"agentq-3-{SAME}" if reuse else "call_1")
    assert effect is not None and effect.step == 3 and effect.state == "done"


def test_an_effect_begun_before_records_named_their_call_is_still_its_calls_after_a_crash(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    """A call in flight at the deploy: its effect was begun, with no step on the record, after
    its turn was asked for, and the worker died. The next run reports it, never runs it again."""
    task = _task(store, ["charge_card"])
    model = _Turns([(SAME, "charge_card", {"amount_cents": 11, "memo": "one"})])
    engine = _engine(store, registry, model)
    lease, _ = store.tasks.claim(task.task_id, "crashed", 0.1)  # type: ignore[misc]
    step = LLMStep(content=model.complete(LLMRequest(model="m", messages=[], max_tokens=100)).content,
                   stop_reason="tool_use", model="m", usage=Usage(), started_at=time.time(), duration_ms=1)  # fmt: skip
    store.steps.commit(lease, 1, step, root_id=task.task_id)
    assert store.effects.begin(lease, SAME, "charge_card") is None  # no step: as records were begun before
    time.sleep(0.15)
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    results = store.steps.load(task.task_id)[1].body
    assert isinstance(results, ToolsStep) and results.results[0].status == "unknown_outcome"
    assert _charges(ledger) == []


class _Fanout:
    """Stands in for the Step Functions fan-out: the test runs the children itself."""

    def start(self, *, parent: Task, spawn_id: str, children: list[Any], max_concurrency: int) -> str:
        return f"arn:aws:states:local:000000000000:execution:fanout:{spawn_id}"


@pytest.mark.parametrize("reuse", [True, False], ids=["id-reused", "control-new-id"])
def test_a_spawn_under_an_earlier_spawns_id_makes_its_own_children(
    store: Storage, registry: ToolRegistry, reuse: bool
) -> None:
    child = {"goal": "look", "tools": [], "script": {"turns": [{"text": "child done"}]}}
    spawn = ("spawn_subagents", {"subagents": [child]})
    model = _Turns([(SAME, *spawn)], [(SAME if reuse else "call_1", *spawn)])
    task = _task(store, ["spawn_subagents"], max_tokens=400_000)
    engine = _engine(store, registry, model, fanout=_Fanout())
    for _ in range(2):
        assert engine.run(task.task_id).status is TaskStatus.WAITING
        spawns = store.spawns.list(task.task_id)
        for record in spawns:
            for child_id in record.children:
                if not store.tasks.get(child_id).status.terminal:
                    assert engine.run(child_id).status is TaskStatus.SUCCEEDED
            store.spawns.mark(task.task_id, record.spawn_id, woken=True)  # what the fan-out's end does
        store.tasks.transition(task.task_id, TaskStatus.QUEUED)
    spawns = store.spawns.list(task.task_id)
    assert len(spawns) == 2 and len({c for r in spawns for c in r.children}) == 2, "the second spawn made no child"
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    results = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, ToolsStep)]
    assert [r.results[0].tool_use_id for r in results] == [SAME, SAME if reuse else "call_1"]


# An id a gateway passes through (a prefix and a UUID): 41 characters, reused by the next turn.
LONG = "call_9f1c2d3e-4b5a-6789-abcd-ef0123456789"


@pytest.mark.parametrize("use_id", [LONG, SAME], ids=["long-id", "control-short-id"])
def test_two_spawns_under_a_reused_long_tool_use_id_each_start_their_own_fanout_execution(
    moto_server: Any, use_id: str
) -> None:
    """The Step Functions fan-out on the moto server: the second spawn's execution is its own,
    not the first (ended) one that an ExecutionAlreadyExists would hand it."""
    settings = deployment(moto_server)  # with the fan-out's state machine
    store, registry, fanout = build_store(settings), build_registry(settings), build_fanout(settings)
    assert fanout is not None
    child = {"goal": "look", "tools": [], "script": {"turns": [{"text": "child done"}]}}
    spawn = (use_id, "spawn_subagents", {"subagents": [child]})
    task = _task(store, ["spawn_subagents"], max_tokens=400_000)
    engine = _engine(store, registry, _Turns([spawn], [spawn]), fanout=fanout)
    assert engine.run(task.task_id).status is TaskStatus.WAITING
    (first,) = store.spawns.list(task.task_id)
    for child_id in first.children:
        assert engine.run(child_id).status is TaskStatus.SUCCEEDED
    store.spawns.mark(task.task_id, first.spawn_id, woken=True)  # what the fan-out's end does
    store.tasks.transition(task.task_id, TaskStatus.QUEUED)
    assert engine.run(task.task_id).status is TaskStatus.WAITING  # the second spawn, under the same id
    records = store.spawns.list(task.task_id)
    assert len(records) == 2 and records[0].spawn_id != records[1].spawn_id
    arns = [r.execution_arn for r in records]
    assert arns[0] != arns[1], f"the second spawn was handed the first spawn's fan-out execution: {arns}"


def test_a_fanout_execution_name_keeps_to_step_functions_rules_and_to_todays_names_for_model_ids() -> None:
    """At most 80 characters of [A-Za-z0-9_-] (CloudWatch logs only such names); a key agentq
    names (``agentq-<step>-<id>``) never shares a name with another, however long the id; a
    key that is the model's id keeps the name it had, so a start begun before this naming (an
    in-flight or zombie worker's) still finds its execution."""
    parent = "0" * 40
    names = {execution_name(parent, f"agentq-{step}-{LONG}") for step in range(1, 50)}
    assert len(names) == 49
    assert all(len(n) <= 80 and re.fullmatch(r"[A-Za-z0-9_-]+", n) for n in names)
    assert execution_name(parent, LONG) == f"{parent[:32]}-{LONG[-40:]}"
    assert execution_name(parent, "call_0") == f"{parent[:32]}-call_0"
