"""Who may decide a held call, over real HTTP on the local stack (auth on, real tokens of a local
OIDC issuer, real keys, real worker processes): a policy rule's ``ask`` is its tenant's to decide
unless the rule says ``@approver("user")``. An end user's token approving or rejecting a
tenant-only ask is a 403 naming why, by HTTP, A2A and MCP alike, and nothing changes: the task
stays paused, the charge never runs, no decision is recorded; the tenant's key decides it. A
``user`` ask is still its user's to decide. The pending record keeps who decides it, so a rule
edited while a call waits does not change it, and a bad ``@approver`` is refused at write time.

Every rule is scoped to an agent of the test's own tenant, so the tests sharing the stack never
meet them (the stack's workers read rules at every check: tests/conftest.py)."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import anyio

from tests.api_support import ApiStack
from tests.helpers import call, run_agentq

RULE = """@id("big-refunds") @effect("ask") {approver}
@message("refunds above 100 cents need a person's approval")
forbid(principal, action == Action::"tool", resource == Tool::"charge_card")
when {{ context.args has amount_cents && context.args.amount_cents > 100 }};"""


def _setup(api: ApiStack, approver: str | None = "", **agent: Any) -> tuple[str, str, str, int]:
    """A tenant of its own with an agent that makes one charge a rule asks for (``approver``
    None: no rule): (its key, a token of its end user mallory, the agent's name, the charge's
    amount, unique to this test)."""
    tenant = f"appr-{uuid.uuid4().hex[:8]}"
    key = api.stack.create_api_key(tenant, act_for_users=True)  # its backend's: it may act for its users
    token = api.stack.token(user="mallory", tenant=tenant)
    amount = random.randrange(10_000_000, 90_000_000)
    turns = [{"text": "", "tool_calls": [call("charge_card", amount_cents=amount, memo="refund")]}, {"text": "done"}]
    name = f"refunds-{uuid.uuid4().hex[:6]}"
    made = {"name": name, "provider": "scripted", "script": {"turns": turns}, "tools": ["charge_card"], **agent}
    status, data, _ = api.http("POST", "/agents", made, key=key)
    assert status == 201, data
    if approver is not None:
        rule = {"policies": RULE.format(approver=approver)}
        status, data, _ = api.http("PUT", f"/policies/agent:{name}", rule, key=key)
        assert status == 201, data
    return key, token, name, amount


def _charges(api: ApiStack, amount: int) -> int:
    """Executions of charge_card with ``amount`` by the stack's worker processes (their ledger)."""
    file = Path(api.stack.extra_env["AGENTQ_TEST_LEDGER"])
    lines = file.read_text().splitlines() if file.exists() else []
    return sum(1 for line in lines if json.loads(line).get("amount") == amount)


def _paused(api: ApiStack, token: str, name: str) -> tuple[str, dict[str, Any]]:
    task_id = api.submit({"goal": "refund my order", "agent": name}, key=token)
    view = api.until(task_id, lambda v: v["status"] in ("paused", "succeeded", "failed"), key=token)
    assert view["status"] == "paused", view
    return task_id, view


def _session(url: str, key: str, work: Any) -> Any:
    """``work`` on an MCP session of the official client declaring the tasks extension."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from tests.mcp_tasks_client import AgentqTasks

    async def run() -> Any:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http), extensions=[AgentqTasks()]) as c:
            return await work(c)

    return anyio.run(run)


def _decisions(api: ApiStack, task_id: str, key: str) -> list[dict[str, Any]]:
    status, page, _ = api.http("GET", f"/tasks/{task_id}/events?limit=200", key=key)
    assert status == 200, page
    return [e["data"] for e in page["events"] if e["type"] == "approval.decided"]


def test_a_token_can_neither_approve_nor_reject_a_rules_ask_and_the_tenants_key_decides_it(api_stack: ApiStack) -> None:
    """The operator's "refunds over $1 ask" is not the refunded user's to approve: their token's
    approve and reject are each a 403 ``not_the_approver`` naming why, the task stays paused, the
    charge never runs and no decision is recorded; the view says who decides; the tenant's key
    approves and the charge runs once."""
    api = api_stack
    key, token, name, amount = _setup(api)
    task_id, _view = _paused(api, token, name)
    for verb in ("approve", "reject"):
        status, answer, _ = api.http("POST", f"/tasks/{task_id}/{verb}", {"note": "mine"}, key=token)
        assert status == 403, (verb, answer)
        error = answer["error"]
        assert error["code"] == "not_the_approver" and error["field"] == "task_id", error
        assert "tenant's to decide" in error["message"] and "'mallory' may not approve or reject" in error["message"]
    view = api.until(task_id, lambda v: True, key=token)
    assert view["status"] == "paused" and view["pending_approver"] == "tenant", view
    assert view["activity"].startswith("waiting for approval by the tenant (its API key decides"), view
    assert _decisions(api, task_id, key) == [] and _charges(api, amount) == 0
    trace = api.http("GET", f"/tasks/{task_id}/trace", key=key)[1]["events"]
    [asked] = [e for e in trace if e.get("event") == "approval_requested"]
    assert asked["detail"]["approver"] == "tenant", asked

    assert api.http("POST", f"/tasks/{task_id}/approve", {"note": "ops ok"}, key=key)[0] == 200
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=key)["status"] == "succeeded"
    [decided] = _decisions(api, task_id, key)
    assert decided["approved"] is True and "by_user" not in decided and _charges(api, amount) == 1


def test_a_rule_whose_approver_is_user_is_still_decided_by_the_tasks_own_token(api_stack: ApiStack) -> None:
    """``@approver("user")``: the ask is a confirmation its end user gives; their token approves
    it (recorded as theirs) and the call runs."""
    api = api_stack
    key, token, name, amount = _setup(api, approver='@approver("user")')
    task_id, view = _paused(api, token, name)
    assert view["pending_approver"] == "user" and view["activity"].startswith("waiting for approval: "), view
    assert api.http("POST", f"/tasks/{task_id}/approve", {"note": "yes, me"}, key=token)[0] == 200
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=token)["status"] == "succeeded"
    [decided] = _decisions(api, task_id, key)
    assert decided["by_user"] == "mallory" and _charges(api, amount) == 1


def test_a_tools_ask_tenant_policy_is_decided_by_the_tenant_only_and_its_ask_by_the_user_too(
    api_stack: ApiStack,
) -> None:
    """An agent's tool policy has the same choice: ``ask_tenant`` holds each call for the
    tenant's keys (the token's approve is 403, nothing run), ``ask`` lets the task's end user's
    token decide, as before."""
    api = api_stack
    key, token, name, amount = _setup(api, approver=None, tool_policies={"charge_card": "ask_tenant"})
    task_id, view = _paused(api, token, name)
    status, answer, _ = api.http("POST", f"/tasks/{task_id}/approve", {}, key=token)
    assert status == 403 and answer["error"]["code"] == "not_the_approver", answer
    assert api.until(task_id, lambda v: True, key=token)["pending_approver"] == "tenant" and _charges(api, amount) == 0
    assert api.http("POST", f"/tasks/{task_id}/approve", {}, key=key)[0] == 200
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=key)["status"] == "succeeded"
    assert _charges(api, amount) == 1

    key, token, name, amount = _setup(api, approver=None, tool_policies={"charge_card": "ask"})
    task_id, view = _paused(api, token, name)
    assert view["pending_approver"] == "user", view
    assert api.http("POST", f"/tasks/{task_id}/approve", {}, key=token)[0] == 200
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=token)["status"] == "succeeded"
    assert _charges(api, amount) == 1


def test_a_caps_soft_threshold_is_the_tenants_to_approve_not_the_capped_users_token(api_stack: ApiStack) -> None:
    """A cap's soft threshold ("ask me above $3, never past $5") is the operator's line on what
    the user spends: the user's token may not approve its own way past it (403, the task still
    paused, nothing spent past the line); the tenant's key does, and the task goes on."""
    api = api_stack
    key, token, name, amount = _setup(api, approver=None)
    soft = {"daily_tokens": 100_000_000, "soft_daily_tokens": 1}
    assert api.http("PUT", "/caps/user/mallory", soft, key=key)[0] == 200
    task_id, _view = _paused(api, token, name)
    status, answer, _ = api.http("POST", f"/tasks/{task_id}/approve", {}, key=token)
    assert status == 403 and answer["error"]["code"] == "not_the_approver", answer
    view = api.until(task_id, lambda v: True, key=token)
    assert view["status"] == "paused" and view["pending_approver"] == "tenant", view
    assert "soft" in view["pending_approval"] and _decisions(api, task_id, key) == [], view
    # No tool call is held (the pause comes before a model call): the view names the cap's approval.
    assert view["pending_calls"] == [] and view["pending_tool_use_id"].startswith("agentq-cap-user-day-"), view
    assert api.http("POST", f"/tasks/{task_id}/approve", {"note": "ops: fine today"}, key=key)[0] == 200
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=key)["status"] == "succeeded"
    [decided] = _decisions(api, task_id, key)
    assert decided["approved"] is True and "by_user" not in decided and _charges(api, amount) == 1


def test_a_capped_scopes_pause_tells_an_end_users_token_nothing_of_what_other_users_spent(
    api_stack: ApiStack,
) -> None:
    """A scope's cap (here the agent's, which all the tenant's users share) pauses a task at its
    soft threshold with a message naming what the window holds ("at N tokens"), and that message
    is what the task's view (``pending_approval``, ``activity``), its events, A2A and MCP show the
    task's own user. For an agent or key scope that N is every user's spend: bob's token learnt
    alice's. ``GET /usage`` keeps exactly that from a token (its ``caps`` are its own user's only).
    Bob's task says why it waits (the agent's soft threshold, this call's hold) without it."""
    api, tenant = api_stack, f"ap-caps-{uuid.uuid4().hex[:6]}"
    key = api.stack.create_api_key(tenant)
    alice = api.stack.token(user="alice", tenant=tenant)
    bob = api.stack.token(user="bob", tenant=tenant)
    name = f"capped-{uuid.uuid4().hex[:6]}"
    made = {"name": name, "provider": "scripted", "script": {"turns": [{"text": "hi"}]}}
    assert api.http("POST", "/agents", made, key=key)[0] == 201
    # A cap no call fits names the size of one call's hold: the soft threshold then lets one call
    # by and pauses the next (the hold is the same for the same submission).
    assert api.http("PUT", f"/caps/agent/{name}", {"daily_tokens": 1}, key=key)[0] == 200
    probe = api.submit({"goal": "hi", "agent": name}, key=key)
    view = api.until(probe, lambda v: v["retry"] is not None, key=key)
    hold = int(view["retry"]["error"]["message"].split("this call holds ", 1)[1].split(" tokens", 1)[0])
    assert api.http("POST", f"/tasks/{probe}/cancel", key=key)[0] == 200
    caps = {"daily_tokens": 10 * hold, "soft_daily_tokens": hold + 1}
    assert api.http("PUT", f"/caps/agent/{name}", caps, key=key)[0] == 200

    theirs = api.submit({"goal": "hi", "agent": name}, key=alice)
    used = api.until(theirs, lambda v: v["status"] == "succeeded", key=alice)["tokens"]["total"]
    assert used > 1
    mine = api.submit({"goal": "hi", "agent": name}, key=bob)
    view = api.until(mine, lambda v: v["status"] == "paused", key=bob)
    events = api.http("GET", f"/tasks/{mine}/events", key=bob)[1]["events"]
    shown = " ".join(str(x) for x in (view["pending_approval"], view["activity"], view["retry"], events))
    assert f"at {used} tokens" not in shown, f"bob's token reads what alice's task spent ({used} tokens): {shown[:400]}"
    assert f"agent {name!r} would pass its soft threshold of {hold + 1} tokens a day" in view["pending_approval"]
    assert f"this call holds {hold} tokens" in view["pending_approval"], view


def test_an_ask_keeps_its_approver_when_the_rule_is_edited_while_it_waits(api_stack: ApiStack) -> None:
    """Who decides is fixed on the pending record when the call is held: the rule rewritten to
    ``@approver("user")`` meanwhile does not let the token decide the ask already made."""
    api = api_stack
    key, token, name, amount = _setup(api)
    task_id, _view = _paused(api, token, name)
    edited = RULE.format(approver='@approver("user")')
    assert api.http("PUT", f"/policies/agent:{name}", {"policies": edited}, key=key)[0] == 201
    status, answer, _ = api.http("POST", f"/tasks/{task_id}/approve", {}, key=token)
    assert status == 403 and answer["error"]["code"] == "not_the_approver", answer
    assert api.until(task_id, lambda v: True, key=key)["pending_approver"] == "tenant"
    assert _charges(api, amount) == 0


def test_the_cli_a2a_and_mcp_refuse_a_tokens_decision_of_a_tenant_only_ask_naming_why(api_stack: ApiStack) -> None:
    """The same refusal through every other way in: ``agentq approve`` with the token fails
    naming why; A2A's ``approve`` message is an invalid-params error naming why; MCP's tasks
    extension shows the task ``working``, waiting for the tenant (no input the token can give),
    and its ``tasks/update`` of the approval is ``-32602`` naming why. Nothing is decided by
    any; ``agentq approve`` with the tenant's key decides it."""
    from tests.mcp_tasks_client import get_task, update_task

    api = api_stack
    key, token, name, amount = _setup(api)
    task_id, view = _paused(api, token, name)
    cli = run_agentq(["approve", task_id, "--note", "mine"], api.cli_env(AGENTQ_API_KEY=token), 60)
    assert cli.returncode != 0 and "not approve or reject" in cli.stderr, cli
    message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": "approve"}], "taskId": task_id}
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    status, answer, _ = api.http("POST", f"/a2a/{name}", body, key=token, headers={"A2A-Version": "1.0"})
    assert "error" in answer and "not approve or reject" in json.dumps(answer["error"]), (status, answer)
    use_id = view["pending_calls"][0]["tool_use_id"]

    async def work(client: Any) -> Any:
        seen = await get_task(client.session, task_id)
        try:
            await update_task(client.session, task_id, {f"approval-{use_id}": {"action": "accept",
                                                                                "content": {"approved": True}}})  # fmt: skip
        except Exception as exc:  # the protocol's error is the point
            return seen, exc
        return seen, None

    seen, refused = _session(api.url, token, work)
    assert seen.status == "working" and "waiting for the tenant's approval" in (seen.status_message or ""), seen
    assert not seen.input_requests, seen
    assert getattr(refused, "code", None) == -32602 and "not approve or reject" in str(refused), refused
    assert api.until(task_id, lambda v: True, key=key)["status"] == "paused"
    assert _decisions(api, task_id, key) == [] and _charges(api, amount) == 0
    cli = run_agentq(["approve", task_id], api.cli_env(AGENTQ_API_KEY=key), 60)
    assert cli.returncode == 0 and f"approved {task_id}" in cli.stdout, cli
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=key)["status"] == "succeeded"


def test_a_bad_approver_is_refused_at_write_time_naming_the_rule_and_nothing_is_stored(api_stack: ApiStack) -> None:
    """``@approver`` is ``tenant`` or ``user``, on an ``ask`` rule: any other value, or one on a
    deny rule, is a 422 naming ``policies`` and the rule, nothing stored. A good one is shown in
    the rules' view and in a test decision."""
    api, scope = api_stack, f"agent:appr-bad-{uuid.uuid4().hex[:8]}"
    bad = {
        '@approver is "tenant"': RULE.format(approver='@approver("operator")'),
        "@approver names who decides an ask": RULE.replace('@effect("ask")', '@approver("user")').format(approver=""),
    }
    for why, text in bad.items():
        status, data, _ = api.http("PUT", f"/policies/{scope}", {"policies": text})
        assert status == 422 and data["error"]["field"] == "policies", (why, data)
        assert why in data["error"]["message"] and "'big-refunds'" in data["error"]["message"], (why, data)
    assert api.http("GET", f"/policies/{scope}")[0] == 404  # nothing stored
    status, data, _ = api.http("PUT", f"/policies/{scope}", {"policies": RULE.format(approver="")})
    assert status == 201 and [r["approver"] for r in data["policy"]["rules"]] == ["tenant"], data
    sample = {"call": {"kind": "tool", "tool": "charge_card", "args": {"amount_cents": 500}},
              "principal": {"agent": scope.removeprefix("agent:")}}  # fmt: skip
    status, decision, _ = api.http("POST", "/policies/test", sample)
    assert status == 200 and (decision["decision"], decision["approver"]) == ("ask", "tenant"), decision


def test_a_timeout_never_approves_a_tenant_only_ask_on_a_tokens_say_so(api_stack: ApiStack) -> None:
    """A timed-out approval takes the task's ``approval_default``. A token setting ``approve``
    (with a timeout of a second) would have the timer approve the operator's ask for the user:
    403 naming ``constraints.approval_default``, nothing created; so would a token setting the
    timeout of an agent whose default is ``approve`` (403 naming
    ``constraints.approval_timeout_seconds``). A token's own timeout rejects: the ask times out
    rejected and the charge never runs. The tenant's ``approve`` (its key's submission) is the
    tenant's say-so: that timeout approves."""
    api = api_stack
    key, token, name, amount = _setup(api)
    soon = {"approval_timeout_seconds": 1}
    for constraints, field in (({**soon, "approval_default": "approve"}, "constraints.approval_default"),
                               ({"approval_default": "approve"}, "constraints.approval_default")):  # fmt: skip
        body = {"goal": "refund my order", "agent": name, "constraints": constraints}
        status, answer, _ = api.http("POST", "/tasks", body, key=token)
        assert (status, answer["error"]["code"], answer["error"]["field"]) == (403, "forbidden", field), answer
    lenient = f"{name}-lenient"
    made: dict[str, Any] = {"name": lenient, "provider": "scripted", "script": {"turns": [{"text": "hi"}]},
                            "constraints": {"approval_timeout_seconds": 3600, "approval_default": "approve"}}  # fmt: skip
    assert api.http("POST", "/agents", made, key=key)[0] == 201, made
    status, answer, _ = api.http("POST", "/tasks", {"goal": "g", "agent": lenient, "constraints": soon}, key=token)
    assert (status, answer["error"]["field"]) == (403, "constraints.approval_timeout_seconds"), answer
    status, page, _ = api.http("GET", "/tasks", key=key)
    assert status == 200 and page["tasks"] == [], page  # nothing created

    task_id = api.submit({"goal": "refund my order", "agent": name, "constraints": soon}, key=token)
    view = api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=token)
    assert view["status"] == "succeeded" and _charges(api, amount) == 0, view
    [decided] = _decisions(api, task_id, key)
    assert (decided["approved"], decided["by"]) == (False, "timeout"), decided

    body = {"goal": "refund", "agent": name, "user": "mallory", "constraints": {**soon, "approval_default": "approve"}}
    task_id = api.submit(body, key=key)  # the tenant's backend, for its user
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=key)["status"] == "succeeded"
    [decided] = _decisions(api, task_id, key)
    assert (decided["approved"], decided["by"]) == (True, "timeout") and _charges(api, amount) == 1
