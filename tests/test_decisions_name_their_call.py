"""A decision names the held call it decides (``tool_use_id``: the view's ``pending_tool_use_id``),
and decides that call or nothing. A paused task holds one call at a time; once that one is
decided it runs on and may hold the next before a second reviewer's click, a double click or a
retried request lands. Before, ``control.operations.decide`` decided whatever was pending when
the request arrived: a tenant rule asks for every charge, the script charges 5 cents then
50,000; alice approves the 5-cent charge, the worker makes it and holds the 50,000-cent one,
and bob's approve of the 5-cent charge he was shown approved the 50,000-cent one nobody saw.

Now such a decision is refused naming ``tool_use_id`` (409 by HTTP, exit 1 by the CLI, an
invalid-params error naming ``toolUseId`` by A2A) and changes nothing; the CLI reads, shows and
names the held call itself; a double click of the same approve stays a clear 409, never a 500.
The core test first (the engine and the control function), then each way in over real HTTP to
the local stack with its worker processes."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any, cast

import pytest

from agentq.control import operations
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import IllegalTransition
from agentq.core.models import TaskStatus
from agentq.core.policies import check
from agentq.core.tools import ToolRegistry
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage

from tests.api_support import ApiStack
from tests.helpers import call, run_agentq, scripted

RULE = """@id("every-charge") @effect("ask") @message("every charge needs the operator's approval")
forbid(principal, action == Action::"tool", resource == Tool::"charge_card");"""
SMALL, BIG = 5, 50_000


class _NoSends:
    """The queues of a test that runs the engine itself: a decision's requeue has no reader."""

    def send(self, *args: Any, **kwargs: Any) -> None:
        pass


QUEUES = cast(TaskQueues, _NoSends())


def _charged(ledger: Path) -> list[int]:
    return [json.loads(line)["amount"] for line in ledger.read_text().splitlines()] if ledger.exists() else []


def test_an_approve_naming_the_call_a_reviewer_saw_never_approves_the_next_held_call(
    store: Storage, registry: ToolRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's approve, a double click of alice's before the worker ran, and bob's after it held
    the 50,000-cent charge, each name the 5-cent charge: each is refused naming ``tool_use_id``
    and saying who decided it and what is held now; the big charge stays held, undecided, until
    an approve names it."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    store.policies.put("acme", "tenant", RULE, check(RULE).digest)
    turns = [
        {"text": "", "tool_calls": [call("charge_card", amount_cents=SMALL, memo="small")]},
        {"text": "", "tool_calls": [call("charge_card", amount_cents=BIG, memo="big")]},
        {"text": "done"},
    ]
    task = store.tasks.create(scripted(turns, tools=["charge_card"]), tenant="acme")
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30, policy_cache_seconds=0))
    assert engine.run(task.task_id).status is TaskStatus.PAUSED
    seen = store.approvals.pending(task.task_id)
    assert seen is not None and str(SMALL) in seen.question  # what both reviewers were shown
    operations.decide(store, QUEUES, task.task_id, approved=True, by="alice", tenant="acme", tool_use_id=seen.use_id)

    with pytest.raises(IllegalTransition) as clicked_twice:  # before the worker ran it: the task is queued
        operations.decide(store, QUEUES, task.task_id, approved=True, by="alice", tenant="acme",
                          tool_use_id=seen.use_id)  # fmt: skip
    assert clicked_twice.value.field == "tool_use_id", clicked_twice.value.message
    assert "was approved already (by alice)" in clicked_twice.value.message
    assert "it is queued now" in clicked_twice.value.message

    assert engine.run(task.task_id).status is TaskStatus.PAUSED  # the small charge ran; the big one is held
    held = store.approvals.pending(task.task_id)
    assert held is not None and held.use_id != seen.use_id and str(BIG) in held.question
    with pytest.raises(IllegalTransition) as refused:  # bob's click, for the 5-cent charge he saw
        operations.decide(store, QUEUES, task.task_id, approved=True, by="bob", tenant="acme",
                          tool_use_id=seen.use_id)  # fmt: skip
    assert refused.value.field == "tool_use_id", refused.value.message
    assert "was approved already (by alice)" in refused.value.message and repr(held.use_id) in refused.value.message
    assert store.approvals.pending(task.task_id) == held and store.tasks.get(task.task_id).status is TaskStatus.PAUSED
    never = "toolu_never_asked"
    with pytest.raises(IllegalTransition, match="never held a call 'toolu_never_asked'") as unknown:
        operations.decide(store, QUEUES, task.task_id, approved=True, by="bob", tenant="acme", tool_use_id=never)
    assert unknown.value.field == "tool_use_id" and store.approvals.pending(task.task_id) == held
    assert _charged(ledger) == [SMALL], f"the {BIG}-cent charge was approved by a click for the {SMALL}-cent one"

    operations.decide(store, QUEUES, task.task_id, approved=True, by="bob", tenant="acme", tool_use_id=held.use_id)
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED and _charged(ledger) == [SMALL, BIG]


# ------------------------------------------------------------------ over HTTP, the CLI and A2A


def _held_twice(api: ApiStack) -> tuple[str, str, int, int]:
    """A tenant of its own whose agent charges a small then a big amount (unique to the test),
    each held by the agent's rule for the tenant's approval: (its key, the agent, small, big)."""
    tenant = f"named-{uuid.uuid4().hex[:8]}"
    key = api.stack.create_api_key(tenant)
    small, big = random.randrange(10_000, 90_000), random.randrange(10_000_000, 90_000_000)
    turns = [
        {"text": "", "tool_calls": [call("charge_card", amount_cents=small, memo="small")]},
        {"text": "", "tool_calls": [call("charge_card", amount_cents=big, memo="big")]},
        {"text": "done"},
    ]
    name = f"charges-{uuid.uuid4().hex[:6]}"
    made = {"name": name, "provider": "scripted", "script": {"turns": turns}, "tools": ["charge_card"]}
    status, data, _ = api.http("POST", "/agents", made, key=key)
    assert status == 201, data
    status, data, _ = api.http("PUT", f"/policies/agent:{name}", {"policies": RULE}, key=key)
    assert status == 201, data
    return key, name, small, big


def _charges(api: ApiStack, amount: int) -> int:
    """Executions of charge_card with ``amount`` by the stack's worker processes (their ledger)."""
    return _charged(Path(api.stack.extra_env["AGENTQ_TEST_LEDGER"])).count(amount)


def _holding(api: ApiStack, task_id: str, key: str, amount: int) -> dict[str, Any]:
    """The task's view once it is paused holding the charge of ``amount``."""
    view = api.until(task_id, lambda v: v["status"] in ("succeeded", "failed") or (
        v["status"] == "paused" and f'"amount_cents": {amount}' in json.dumps(v["pending_calls"])), key=key)  # fmt: skip
    assert view["status"] == "paused", view
    [held] = view["pending_calls"]
    assert view["pending_tool_use_id"] == held["tool_use_id"] and held["input"]["amount_cents"] == amount, view
    return view


def test_the_api_answers_409_naming_tool_use_id_to_a_decision_of_a_call_no_longer_held(api_stack: ApiStack) -> None:
    """The view names the held call; an approve naming it decides it; the same approve again (a
    double click, whatever the task is doing by then) is 409 naming ``tool_use_id``, and so is
    one landing when the next call is held: nothing decided, the big charge never made. A bad
    ``tool_use_id`` is a 422 naming it. A reject naming the big charge decides it."""
    api = api_stack
    key, name, small, big = _held_twice(api)
    task_id = api.submit({"goal": "charge", "agent": name}, key=key)
    first = _holding(api, task_id, key, small)["pending_tool_use_id"]
    for bad in ("", 5, "x" * 1001):
        status, answer, _ = api.http("POST", f"/tasks/{task_id}/approve", {"tool_use_id": bad}, key=key)
        assert (status, answer["error"]["field"]) == (422, "tool_use_id"), (bad, answer)
    status, answer, _ = api.http("POST", f"/tasks/{task_id}/approve", {"tool_use_id": first}, key=key)
    assert status == 200, answer
    status, again, _ = api.http("POST", f"/tasks/{task_id}/approve", {"tool_use_id": first}, key=key)
    assert status == 409 and again["error"]["field"] == "tool_use_id", again
    assert again["error"]["code"] == "illegal_transition" and "was approved already" in again["error"]["message"]

    second = _holding(api, task_id, key, big)["pending_tool_use_id"]
    assert second != first
    status, stale, _ = api.http("POST", f"/tasks/{task_id}/approve", {"note": "bob: fine", "tool_use_id": first},
                                key=key)  # fmt: skip
    assert status == 409 and stale["error"]["field"] == "tool_use_id", stale
    assert "was approved already" in stale["error"]["message"] and repr(second) in stale["error"]["message"], stale
    view = api.until(task_id, lambda v: True, key=key)
    assert view["status"] == "paused" and view["pending_tool_use_id"] == second and _charges(api, big) == 0, view
    status, events, _ = api.http("GET", f"/tasks/{task_id}/events?limit=200", key=key)
    assert [e["data"]["tool_use_id"] for e in events["events"] if e["type"] == "approval.decided"] == [first]

    status, answer, _ = api.http("POST", f"/tasks/{task_id}/reject", {"tool_use_id": second}, key=key)
    assert status == 200, answer
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=key)["status"] == "succeeded"
    assert (_charges(api, small), _charges(api, big)) == (1, 0)


def test_agentq_approve_shows_the_held_call_and_names_it_and_a_stale_tool_use_id_exits_1(api_stack: ApiStack) -> None:
    """``agentq approve TASK`` reads the held call, shows it (its id, question and input) and
    sends its id; ``agentq status`` shows the held id; ``--tool-use-id`` naming the small charge
    once the big one is held exits 1 naming ``tool_use_id``, nothing decided."""
    api = api_stack
    key, name, small, big = _held_twice(api)
    env = api.cli_env(AGENTQ_API_KEY=key)
    task_id = api.submit({"goal": "charge", "agent": name}, key=key)
    first = _holding(api, task_id, key, small)["pending_tool_use_id"]
    done = run_agentq(["approve", task_id, "--note", "ok"], env, 60)
    assert done.returncode == 0 and f"approved {task_id}" in done.stdout, done
    assert f"held call {first}: Run charge_card with " in done.stderr and "every charge needs" in done.stderr, done
    assert f'-> charge_card {{"amount_cents": {small}' in done.stderr, done.stderr

    second = _holding(api, task_id, key, big)["pending_tool_use_id"]
    status = run_agentq(["status", task_id], env, 60)
    assert f"held      {second} " in status.stdout, status.stdout
    stale = run_agentq(["approve", task_id, "--tool-use-id", first], env, 60)
    assert stale.returncode == 1 and "(tool_use_id)" in stale.stderr and "was approved already" in stale.stderr, stale
    assert api.until(task_id, lambda v: True, key=key)["pending_tool_use_id"] == second and _charges(api, big) == 0
    refused = run_agentq(["reject", task_id, "--tool-use-id", second], env, 60)
    assert refused.returncode == 0 and f"rejected {task_id}" in refused.stdout, refused
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=key)["status"] == "succeeded"
    assert (_charges(api, small), _charges(api, big)) == (1, 0)


def _decide_a2a(api: ApiStack, name: str, key: str, task_id: str, data: dict[str, Any]) -> dict[str, Any]:
    message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"data": data}], "taskId": task_id}
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": message, "configuration": {"returnImmediately": True}}}  # fmt: skip
    status, answer, _ = api.http("POST", f"/a2a/{name}", body, key=key, headers={"A2A-Version": "1.0"})
    assert status == 200, answer
    return dict(answer)


def _refused_field(answer: dict[str, Any]) -> str | None:
    """The field an A2A invalid-params error names (its ErrorInfo's metadata)."""
    error = answer.get("error") or {}
    return next((d["metadata"]["field"] for d in error.get("data", []) if "field" in d.get("metadata", {})), None)


def test_an_a2a_decision_naming_a_call_no_longer_held_is_refused_naming_tool_use_id(api_stack: ApiStack) -> None:
    """A2A's status message names the held call (``toolUseId``); a data part decision carrying
    it decides that call; sent again, or once the big charge is held, it is an invalid-params
    error naming ``toolUseId`` (not a message handed to the agent), nothing decided."""
    api = api_stack
    key, name, small, big = _held_twice(api)
    task_id = api.submit({"goal": "charge", "agent": name}, key=key)
    first = _holding(api, task_id, key, small)["pending_tool_use_id"]
    got = _decide_a2a(api, name, key, task_id, {"approved": True, "toolUseId": 5})
    assert _refused_field(got) == "toolUseId", got
    got = _decide_a2a(api, name, key, task_id, {"approved": True, "toolUseId": first})
    assert "result" in got, got
    again = _decide_a2a(api, name, key, task_id, {"approved": True, "toolUseId": first})
    assert _refused_field(again) == "toolUseId" and "was approved already" in again["error"]["message"]

    second = _holding(api, task_id, key, big)["pending_tool_use_id"]
    stale = _decide_a2a(api, name, key, task_id, {"approved": True, "note": "bob", "toolUseId": first})
    assert _refused_field(stale) == "toolUseId" and repr(second) in stale["error"]["message"], stale
    assert api.until(task_id, lambda v: True, key=key)["pending_tool_use_id"] == second and _charges(api, big) == 0
    assert "result" in _decide_a2a(api, name, key, task_id, {"approved": False, "toolUseId": second})
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=key)["status"] == "succeeded"
    assert (_charges(api, small), _charges(api, big)) == (1, 0)
