"""A task a cap stopped says by how much: its error names the least its next call could hold
(``needed_tokens`` / ``needed_usd``) and what the budget had left (``available_*``), for each
unit that is short, from the refusal itself (``_session.Shortfall``). The figures are exact: a
raise by their difference lets that call go, and a raise by one token (or one millionth of a
dollar) less does not. A grading call's refusal names the grading call's hold
(tests/test_outcomes_budget.py). An ending no refusal caused (a soft threshold a person
declined) names none, even after a hold shrunk by an earlier refusal. The chaos run's ledger
check reads the same figure to tell an ending the billed usage caused from one the unknown
did (bench/_chaos_ledger.py).

Run on the in-memory twin (``store``, ``registry``): the figures are the engine's, not the
backend's; the budget writes themselves are the storage conformance suite's."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentq.control.conversations import send_message
from agentq.control.operations import raise_budget
from agentq.control.submit import parse_submission
from agentq.core.caps import CapLimits
from agentq.core.engine import Engine, EngineConfig
from agentq.core.engine._session import LeaseState, Session, Shortfall
from agentq.core.engine._stops import budget_error
from agentq.core.models import Lease, LLMStep, TaskStatus
from agentq.core.pricing import dollars, micros
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.helpers import call, scripted
from tests.test_conversations import Queues

STORAGE = "memory"
NOTES = "n" * 800  # ~200 output tokens a turn by the scripted provider's count


def _engine(store: Storage, registry: ToolRegistry) -> Engine:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))


def _turns(n: int = 40) -> list[dict[str, Any]]:
    return [{"text": f"turn {i} {NOTES}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(n)]


def _model_turns(store: Storage, task_id: str) -> int:
    return sum(1 for s in store.steps.load(task_id) if isinstance(s.body, LLMStep))


def _stopped(store: Storage, registry: ToolRegistry, task_id: str) -> dict[str, Any]:
    result = _engine(store, registry).run(task_id)
    assert result.status is TaskStatus.COST_EXCEEDED, result
    error = store.tasks.get(task_id).error
    assert error is not None and error["code"] == "budget_exceeded", error
    return error


@pytest.mark.parametrize("short", [0, 1], ids=["raised_by_the_difference", "raised_by_one_less"])
def test_a_token_caps_error_names_what_the_next_call_needed_and_a_raise_by_the_difference_lets_it_go(
    store: Storage, registry: ToolRegistry, short: int
) -> None:
    task = store.tasks.create(scripted(_turns(), tools=["lookup"], max_tokens=6000, max_output_tokens=300), tenant="t")
    error = _stopped(store, registry, task.task_id)
    needed, available = error["needed_tokens"], error["available_tokens"]
    assert needed > available == store.budgets.get(task.task_id).available
    assert f"needs at least {needed} tokens and {available} are left" in error["message"]
    turns = _model_turns(store, task.task_id)

    raise_budget(store, Queues(), task.task_id, add_tokens=needed - available - short)
    _engine(store, registry).run(task.task_id)
    after = store.tasks.get(task.task_id)
    if short:  # nothing was sent, and the error says the same call, with the raise now left
        assert _model_turns(store, task.task_id) == turns
        assert after.status is TaskStatus.COST_EXCEEDED and after.error is not None
        assert (after.error["needed_tokens"], after.error["available_tokens"]) == (needed, needed - 1)
    else:  # the call went, its answer shrunk to what was left
        assert _model_turns(store, task.task_id) == turns + 1
    budget = store.budgets.get(task.task_id)
    assert budget.used <= budget.cap and budget.reserved == 0


@pytest.mark.parametrize("short", [0, 1], ids=["raised_by_the_difference", "raised_by_one_less"])
@pytest.mark.parametrize(("model", "cap"), [("claude-sonnet-4-6", "0.02"), ("gpt-4o-mini", "0.002")])
def test_a_money_caps_error_names_what_the_next_call_could_cost_and_a_raise_by_the_difference_lets_it_go(
    store: Storage, registry: ToolRegistry, short: int, model: str, cap: str
) -> None:
    """At whole and at fractional millionths of a dollar a token (gpt-4o-mini's $0.15 and $0.60
    a million: the hold's parts round up apart, and the allowance was a token short of what the
    figure promised). Short answers, so the calls shrink near the cap until one is refused."""
    script = [{"text": f"turn {i} {'n' * 100}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(40)]
    body = {"goal": "spend", "provider": "scripted", "model": model, "script": {"turns": script},
            "constraints": {"tools": ["lookup"], "max_steps": 100, "max_output_tokens": 500, "max_tokens": 2_000_000,
                            "max_cost_usd": cap}}  # fmt: skip
    task = store.tasks.create(parse_submission(body), tenant="t")
    error = _stopped(store, registry, task.task_id)
    needed, available = Decimal(error["needed_usd"]), Decimal(error["available_usd"])
    assert needed > available and micros(available) == store.budgets.get(task.task_id).available_micros
    assert f"could cost up to ${error['needed_usd']} and ${error['available_usd']} is left" in error["message"]
    assert "needed_tokens" not in error  # the money ran out, not the tokens
    turns = _model_turns(store, task.task_id)

    raise_budget(store, Queues(), task.task_id, add_tokens=0, add_usd=needed - available - dollars(short))
    _engine(store, registry).run(task.task_id)
    after = store.tasks.get(task.task_id)
    if short:
        assert _model_turns(store, task.task_id) == turns
        assert after.status is TaskStatus.COST_EXCEEDED and after.error is not None
        assert Decimal(after.error["needed_usd"]) == needed
        assert Decimal(after.error["available_usd"]) == needed - dollars(1)
    else:
        assert _model_turns(store, task.task_id) == turns + 1
    budget = store.budgets.get(task.task_id)
    assert budget.used_micros <= budget.cap_micros and budget.reserved_micros == 0


def test_a_refusal_no_call_met_names_no_shortfall(store: Storage, registry: ToolRegistry) -> None:
    """A person declining a soft threshold ends the task ``cost_exceeded`` too, after its hold
    was taken (shrunk to what was left: a refusal of the full hold came first). No hold was
    refused: the error names no figure, least of all the shrunk hold's."""
    store.caps.put("acme", "user", "alice", CapLimits(hourly_tokens=10**6, soft_hourly_tokens=100))
    body = {"goal": "spend", "provider": "scripted", "script": {"turns": _turns(2)}, "user": "alice",
            "constraints": {"tools": ["lookup"], "max_output_tokens": 300, "max_tokens": 900}}  # fmt: skip
    task = store.tasks.create(parse_submission(body), tenant="acme")
    engine = _engine(store, registry)
    assert engine.run(task.task_id).status is TaskStatus.PAUSED  # its first call's hold passes the threshold
    pending = store.approvals.pending(task.task_id)
    assert pending is not None
    store.approvals.decide(task.task_id, pending.use_id, approved=False, note="", by="reviewer")
    assert engine.run(task.task_id).status is TaskStatus.COST_EXCEEDED
    error = store.tasks.get(task.task_id).error
    assert error is not None and error["code"] == "budget_exceeded" and "declined" in error["message"], error
    assert not {"needed_tokens", "available_tokens", "needed_usd", "available_usd"} & set(error), error
    assert _model_turns(store, task.task_id) == 0


@pytest.mark.parametrize(
    ("shortfall", "named"),
    [
        (Shortfall(500, 400, 1_000, 2_000), {"needed_tokens": 500, "available_tokens": 400}),
        (Shortfall(500, 600, 2_500, 2_000), {"needed_usd": "0.002500", "available_usd": "0.002000"}),
        (
            Shortfall(500, 400, 2_500, 2_000),
            {"needed_tokens": 500, "available_tokens": 400, "needed_usd": "0.002500", "available_usd": "0.002000"},
        ),
        (Shortfall(500, 600, 1_000, 2_000), {}),  # a hold refused though both fit, as read since: a race
    ],
    ids=["tokens", "money", "both", "neither"],
)
def test_the_error_names_every_unit_that_is_short_and_how_to_raise_it(
    store: Storage, shortfall: Shortfall, named: dict[str, Any]
) -> None:
    body = {"goal": "g", "provider": "scripted", "script": {"turns": [{"text": "hi"}]},
            "constraints": {"max_tokens": 9_000, "max_cost_usd": "0.5"}}  # fmt: skip
    task = store.tasks.create(parse_submission(body), tenant="t")
    session = Session(LeaseState(Lease(task_id=task.task_id, owner="w", epoch=1, expires_at=0)), task, [], [], None)
    session.shortfall = shortfall
    error = budget_error(session)
    assert {k: v for k, v in error.items() if k not in ("code", "message")} == named
    message = error["message"]
    assert ("needs at least 500 tokens and 400 are left" in message) == ("needed_tokens" in named)
    assert ("could cost up to $0.002500 and $0.002000 is left" in message) == ("needed_usd" in named)
    raises = ("(add_tokens)", "(add_usd)", "(add_tokens and add_usd)")
    wanted = raises[2] if len(named) == 4 else raises[1] if "needed_usd" in named else raises[0]
    assert [r for r in raises if r in message] == [wanted], message


def test_a_message_that_lengthens_the_next_request_gets_it_a_whole_hold_not_a_shrunk_answer(
    store: Storage, registry: ToolRegistry
) -> None:
    """The tools commit holds the next call's tokens (``reserve_next``); a person's message
    delivered after it makes that call's request longer than the hold was sized for. The hold
    goes back and the call holds afresh, so with room to spare its answer keeps its whole
    allowance: it was cut to what the old hold left past the longer input, and ended the task
    ``cost_exceeded`` ("the budget ran out during the model's turn") with 199,000 tokens left."""
    from tests.test_conversations import Recording

    turns = [{"text": "look", "tool_calls": [call("lookup", query="q")]}, {"text": "x" * 4000}]  # ~1,000 out
    sub = scripted(turns, tools=["lookup"], max_tokens=200_000, max_output_tokens=2_000)
    task = store.tasks.create(sub, tenant="t")
    note = "please also consider this: " + "y" * 4000  # ~1,350 tokens more input for the next call
    provider = Recording(sub, during={1: lambda: send_message(store, Queues(), task.task_id, note, tenant="t")})
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30),
                    providers=lambda _: provider)  # fmt: skip
    result = engine.run(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED, store.tasks.get(task.task_id).error
    assert provider.requests[1].max_tokens == 2_000  # the whole allowance, and the answer whole
    assert store.tasks.get(task.task_id).result == "x" * 4000
