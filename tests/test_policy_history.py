"""A rule over the task's tool calls (``context.history``: ``tools``, ``ok_tools``, ``tool_calls``)
sees every call the task made, after a compaction and within one turn (``core.engine._history``,
``PolicyGate.tool_verdicts``; docs/POLICIES.md "What a rule sees").

A run that claims a compacted task loads the steps from the latest compaction on, and the facts
were read from those alone: a rule forbidding a call *when* the history holds one ("one charge
per task") forgot the first charge and let a second one run, and the model controls what makes a
compaction (long text, large tool results) and a new claim (an approval it asks for). And every
call of a turn was checked against the history before the turn, so a turn of two charges saw no
charge for either. The real engine on the moto server, with the ledger tool of
tests/effect_tools.py counting real charges, each beside its control."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentq.control import operations
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import CompactStep, Task, TaskStatus, ToolsStep
from agentq.core.policies import check
from agentq.core.tools import ToolRegistry
from agentq.storage import keys
from agentq.storage.container import Storage

from tests.helpers import call, scripted

RULE = """@id("one-charge-per-task") @message("this task already made its one charge")
forbid(principal, action == Action::"tool", resource == Tool::"charge_card")
when { context.history.ok_tools.contains("charge_card") };"""
AFTER_LOOKUP = """@id("charge-after-lookup") @message("charges only after a lookup returned ok in this task")
forbid(principal, action == Action::"tool", resource == Tool::"charge_card")
unless { context.history.ok_tools.contains("lookup") };"""
LONG = "x" * 3000
FIRST, SECOND = 1_111, 2_222
TURNS: list[dict[str, Any]] = [
    {"text": "pay", "tool_calls": [call("charge_card", amount_cents=FIRST, memo="one")]},
    *({"text": f"look {i} {LONG}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(4)),
    {"text": "ask", "tool_calls": [call("request_approval", question="may I go on?")]},
    {"text": "pay again", "tool_calls": [call("charge_card", amount_cents=SECOND, memo="two")]},
    {"text": "done"},
]


class _Queues:
    def send(self, *args: Any, **kwargs: Any) -> None:
        pass


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(path))
    return path


def _amounts(ledger: Path) -> list[int]:
    return [json.loads(line)["amount"] for line in ledger.read_text().splitlines()] if ledger.exists() else []


def _engine(store: Storage, registry: ToolRegistry) -> Engine:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30, policy_cache_seconds=0))


def _paused_at_the_question(store: Storage, registry: ToolRegistry, rule: str = RULE) -> Task:
    """The task of TURNS under ``rule``, run to the model's own request_approval and approved."""
    store.policies.put("acme", "tenant", rule, check(rule).digest)
    task = store.tasks.create(
        scripted(TURNS, tools=["charge_card", "lookup", "request_approval"], max_steps=40), tenant="acme"
    )
    assert _engine(store, registry).run(task.task_id).status is TaskStatus.PAUSED
    operations.decide(store, _Queues(), task.task_id, approved=True, by="acme", tenant="acme")  # type: ignore[arg-type]
    return task


def test_a_rule_forbidding_a_second_charge_still_denies_it_after_a_compaction_and_a_new_claim(
    store: Storage, registry: ToolRegistry, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", '{"claude-sonnet-4": 4000}')  # a compaction every two turns
    task = _paused_at_the_question(store, registry)
    compactions = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, CompactStep)]
    assert compactions, "no compaction happened"
    _engine(store, registry).run(task.task_id)
    assert _amounts(ledger) == [FIRST], "the rule allows one charge per task"
    denied = [r for s in store.steps.load(task.task_id) if isinstance(s.body, ToolsStep) for r in s.body.results]
    assert denied[-1].name == "charge_card" and (denied[-1].policy or {}).get("rule") == "tenant/one-charge-per-task"
    # What carried it: the compaction's history of the calls before it, written with the step.
    last = compactions[-1]
    assert last.tools is not None and ("charge_card", "ok") in last.tools.made


def test_control_without_a_compaction_the_same_rule_denies_the_second_charge(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    task = _paused_at_the_question(store, registry)
    assert not any(isinstance(s.body, CompactStep) for s in store.steps.load(task.task_id))
    _engine(store, registry).run(task.task_id)
    assert _amounts(ledger) == [FIRST]


def test_a_compaction_written_before_it_carried_the_history_has_the_steps_before_it_read_instead(
    store: Storage, registry: ToolRegistry, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task in flight at the deploy: its compactions carry no history. The next run reads the
    steps before the latest one (once), and the rule still sees the first charge."""
    monkeypatch.setenv("AGENTQ_CONTEXT_WINDOWS", '{"claude-sonnet-4": 4000}')
    task = _paused_at_the_question(store, registry)
    for record in store.steps.load(task.task_id):
        if isinstance(record.body, CompactStep):
            item = store.table.get(keys.item_key(task.task_id, keys.step_sk(record.number)))
            assert item is not None
            body = record.body.model_copy(update={"tools": None}).model_dump_json()  # as it was stored before
            store.table.put({**{k: v for k, v in item.items() if k not in ("ref", "ref_bytes")}, "body": body})
    assert all(s.body.tools is None for s in store.steps.load(task.task_id) if isinstance(s.body, CompactStep))
    _engine(store, registry).run(task.task_id)
    assert _amounts(ledger) == [FIRST]


def test_a_rule_forbidding_a_second_charge_denies_the_second_of_two_charges_in_one_turn(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    """The first charge of the turn is counted as made, ending ok, when the second is checked."""
    store.policies.put("acme", "tenant", RULE, check(RULE).digest)
    turns = [
        {"text": "pay twice", "tool_calls": [call("charge_card", amount_cents=FIRST, memo="one"),
                                             call("charge_card", amount_cents=SECOND, memo="two")]},
        {"text": "done"},
    ]  # fmt: skip
    task = store.tasks.create(scripted(turns, tools=["charge_card"]), tenant="acme")
    assert _engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert _amounts(ledger) == [FIRST], "the rule allows one charge per task"


@pytest.mark.parametrize("same_turn", [True, False], ids=["beside-the-lookup", "control-a-turn-after"])
def test_a_rule_wanting_a_lookup_that_returned_ok_first_denies_a_charge_beside_the_lookup(
    store: Storage, registry: ToolRegistry, ledger: Path, same_turn: bool
) -> None:
    """Counting a turn's earlier calls as made must not count them as ``ok`` for a rule that
    wants one to have returned ok: the lookup has not run when the charge is checked, so the
    charge waits for a turn after it (the call is checked as if the lookup ended ``error`` too)."""
    store.policies.put("acme", "tenant", AFTER_LOOKUP, check(AFTER_LOOKUP).digest)
    lookup, charge = call("lookup", query="order 7"), call("charge_card", amount_cents=FIRST, memo="one")
    turns: list[dict[str, Any]] = (
        [{"text": "both", "tool_calls": [lookup, charge]}]
        if same_turn
        else [{"text": "look", "tool_calls": [lookup]}, {"text": "pay", "tool_calls": [charge]}]
    )
    task = store.tasks.create(scripted([*turns, {"text": "done"}], tools=["charge_card", "lookup"]), tenant="acme")
    assert _engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert _amounts(ledger) == ([] if same_turn else [FIRST])
