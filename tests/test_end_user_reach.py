"""End users beyond the task routes (issue 43, item 1): ``GET /usage`` breaks the last day's
usage down by end user (a key reads every user of its own tenant, a token only its own row), and
an MCP call on ``/mcp`` may name the end user it acts for under POST /tasks's rule (a key only
if created ``--act-for-users``; a user's token acts as its user and names no other, and reaches
only its own user's tasks through ``agentq_task`` and ``agentq_message``). Real keys and real
tokens of the local OIDC issuer, on the local stack with its workers; cross-tenant and
cross-user probes."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import anyio
import pytest

from agentq.api import user_submission

from tests.api_support import SCRIPTED, ApiStack


def _mcp(url: str, key: str, tool: str, arguments: dict[str, Any]) -> Any:
    """One tools/call through the ``mcp`` package's own client."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def run() -> Any:
        client_http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
        async with Client(streamable_http_client(f"{url}/mcp", http_client=client_http), mode="legacy") as client:
            return await client.call_tool(tool, arguments)

    return anyio.run(run)


def _agent(api: ApiStack, key: str) -> str:
    name = f"reach-{uuid.uuid4().hex[:8]}"
    body = {"name": name, "provider": "scripted", "script": {"turns": [{"text": "hi"}]}, "description": "says hi"}
    status, data, _ = api.http("POST", "/agents", body, key=key)
    assert status == 201, data
    return name


def _tasks(api: ApiStack, key: str) -> list[dict[str, Any]]:
    status, page, _ = api.http("GET", "/tasks?include_children=true", key=key)
    assert status == 200, page
    return list(page["tasks"])


def test_usage_breaks_down_by_user_a_token_sees_its_own_row_and_a_key_its_tenants_users(api_stack: ApiStack) -> None:
    api = api_stack
    alice, bob = api.stack.token(user="alice", tenant="eu-use"), api.stack.token(user="bob", tenant="eu-use")
    key = api.stack.create_api_key("eu-use", act_for_users=True)
    other = api.stack.token(user="alice", tenant="eu-use-other")  # the same user name, another tenant
    greeter = api.greeter("eu-use")
    submitted = {
        "alice": [api.submit(greeter, key=alice), api.submit(greeter, key=alice)],
        "bob": [api.submit(greeter, key=bob)],
        "carol": [api.submit({**SCRIPTED, "user": "carol"}, key=key)],
        None: [api.submit(SCRIPTED, key=key)],  # the tenant's own: no user's row
    }
    theirs = api.submit(api.greeter("eu-use-other"), key=other)
    used: dict[str | None, int] = {}
    for user, ids in submitted.items():
        views = [api.until(t, lambda v: v["status"] == "succeeded", key=key) for t in ids]
        used[user] = sum(v["budget"]["used"] for v in views)
    api.until(theirs, lambda v: v["status"] == "succeeded", key=other)

    status, usage, _ = api.http("GET", "/usage", key=key)
    assert status == 200, usage
    rows = {r["user"]: r for r in usage["users"]}
    assert set(rows) == {"alice", "bob", "carol"} and usage["users_complete"] is True
    for user in ("alice", "bob", "carol"):
        assert rows[user]["trees"] == len(submitted[user]) and rows[user]["known_tokens"] == used[user] > 0
        assert rows[user]["unknown_tokens"] == 0 and rows[user]["running"] == 0
    for token, user in ((alice, "alice"), (bob, "bob")):
        status, own, _ = api.http("GET", "/usage", key=token)
        assert status == 200 and [r["user"] for r in own["users"]] == [user], own
        assert own["users"][0] == rows[user]
    status, foreign, _ = api.http("GET", "/usage", key=other)  # another tenant's alice: its own tree only
    assert status == 200 and [(r["user"], r["trees"]) for r in foreign["users"]] == [("alice", 1)]


def test_an_mcp_call_names_its_user_only_from_a_key_allowed_to_and_a_token_acts_as_its_own(
    api_stack: ApiStack,
) -> None:
    api = api_stack
    plain = api.stack.create_api_key("eu-mcp")
    allowed = api.stack.create_api_key("eu-mcp", act_for_users=True)
    agent = _agent(api, plain)
    call = {"goal": "say hi", "wait_seconds": 20}

    refused = _mcp(api.url, plain, agent, {**call, "user": "dave"})
    assert refused.is_error and "user" in refused.content[0].text and "act-for-users" in refused.content[0].text
    assert _tasks(api, plain) == []  # nothing submitted
    bad = _mcp(api.url, allowed, agent, {**call, "user": "no such user!"})
    assert bad.is_error and bad.content[0].text.startswith("invalid arguments: user")
    assert _tasks(api, plain) == []

    named = _mcp(api.url, allowed, agent, {**call, "user": "dave"})
    assert not named.is_error, named
    dave_task = named.structured_content["task_id"]
    assert api.until(dave_task, lambda v: v["status"] == "succeeded", key=plain)["user"] == "dave"

    erin = api.stack.token(user="erin", tenant="eu-mcp")
    own = _mcp(api.url, erin, agent, call)  # a token's call acts as its user, without naming it
    assert not own.is_error, own
    erin_task = own.structured_content["task_id"]
    assert api.until(erin_task, lambda v: v["status"] == "succeeded", key=plain)["user"] == "erin"
    assert not _mcp(api.url, erin, agent, {**call, "user": "erin"}).is_error  # naming itself is fine
    other = _mcp(api.url, erin, agent, {**call, "user": "dave"})
    assert other.is_error and "user" in other.content[0].text
    assert sorted(t["user"] for t in _tasks(api, plain)) == ["dave", "erin", "erin"]

    # A token reaches its own user's tasks only; another tenant's key reaches none of these.
    assert _mcp(api.url, erin, "agentq_task", {"task_id": erin_task}).structured_content["status"] == "succeeded"
    for key, task_id in ((erin, dave_task), (api.other_key, erin_task), (api.other_key, dave_task)):
        for tool, args in (("agentq_task", {}), ("agentq_message", {"text": "and now?", "wait_seconds": 0})):
            probe = _mcp(api.url, key, tool, {"task_id": task_id, **args})
            assert probe.is_error and "no task" in probe.content[0].text, (tool, probe)
    assert api.http("GET", f"/tasks/{dave_task}/messages", key=plain)[1]["messages"] == []  # no message went in


def test_an_a2a_or_mcp_call_of_a_token_answers_to_post_tasks_allow_list(
    api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The A2A and MCP servers build a call's submission themselves (goal, agent, user, metadata,
    and MCP's budgets), all on a token's allow-list (``api.user_submission``), and pass it through
    the same check as POST /tasks: a field either comes to send that the list does not hold is
    refused to a token's call with nothing created, never let through. Shown by taking
    ``metadata`` (which both send) off the list: a token's call is refused naming it, a key's
    call runs; with the list as it is, a token's call of each runs."""
    api, tenant = api_stack, f"eu-calls-{uuid.uuid4().hex[:6]}"
    key = api.stack.create_api_key(tenant)
    token = api.stack.token(user="erin", tenant=tenant)
    agent = _agent(api, key)
    call = {"goal": "say hi", "wait_seconds": 20}

    def a2a(caller: str) -> Any:
        message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": "say hi"}]}
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
        return api.http("POST", f"/a2a/{agent}", body, key=caller, headers={"A2A-Version": "1.0"})[1]

    assert not _mcp(api.url, token, agent, call).is_error
    assert "result" in a2a(token)
    assert len(_tasks(api, key)) == 2
    monkeypatch.setattr(user_submission, "USER_FIELDS", {
        k: v for k, v in user_submission.USER_FIELDS.items() if k != "metadata"})  # fmt: skip
    refused = _mcp(api.url, token, agent, call)
    assert refused.is_error and refused.content[0].text.startswith("metadata: "), refused
    answer = a2a(token)
    assert "error" in answer and "metadata" in json.dumps(answer["error"]), answer
    assert len(_tasks(api, key)) == 2  # nothing created
    assert not _mcp(api.url, key, agent, call).is_error and "result" in a2a(key)  # a key's call: the whole tenant's


def test_a_tokens_a2a_or_mcp_call_of_an_agent_with_an_alias_is_refused_naming_agent_and_a_keys_runs_the_latest(
    api_stack: ApiStack,
) -> None:
    """``/a2a/{agent}`` and an agent's MCP tool name the agent bare: its latest version. Once the
    tenant routes its users through an alias, a token's call would step onto a version the alias
    does not give them (a candidate created after it), so it is refused naming ``agent``, as
    POST /tasks refuses it, with nothing created; a key's call runs the latest, the tenant's own
    choice."""
    api, tenant = api_stack, f"eu-routed-{uuid.uuid4().hex[:6]}"
    key = api.stack.create_api_key(tenant)
    token = api.stack.token(user="erin", tenant=tenant)
    agent = _agent(api, key)
    prod = {"versions": [{"version": 1, "weight": 100}]}
    assert api.http("PUT", f"/agents/{agent}/aliases/prod", prod, key=key)[0] == 200
    candidate = {"name": agent, "provider": "scripted", "script": {"turns": [{"text": "candidate"}]}}
    assert api.http("POST", "/agents", candidate, key=key)[1]["agent"]["version"] == 2
    call = {"goal": "say hi", "wait_seconds": 20}

    def a2a(caller: str) -> Any:
        message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": "say hi"}]}
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
        return api.http("POST", f"/a2a/{agent}", body, key=caller, headers={"A2A-Version": "1.0"})[1]

    refused = _mcp(api.url, token, agent, call)
    assert refused.is_error and refused.content[0].text.startswith(f"agent: {agent!r} is routed"), refused
    answer = a2a(token)
    assert answer["error"]["code"] == -32602 and answer["error"]["data"][0]["metadata"]["field"] == "agent", answer
    assert f"a user's token names one ({agent}@prod)" in answer["error"]["message"], answer
    assert _tasks(api, key) == []  # nothing created
    ran = _mcp(api.url, key, agent, call)
    assert not ran.is_error and ran.structured_content["result"] == "candidate", ran
    assert "result" in a2a(key)
    ran_on = {api.http("GET", f"/tasks/{t['task_id']}", key=key)[1]["agent"] for t in _tasks(api, key)}
    assert ran_on == {f"{agent}@2"}


def test_an_end_users_token_reads_no_other_users_graded_tasks_through_an_agents_quality_report(
    api_stack: ApiStack,
) -> None:
    """``GET /agents/{name}/quality`` counts every sampled task of the agent, whoever it acted for:
    how many each hour, how many passed, what they cost. A token sees only its user's tasks and
    no tenant-wide route, but ``api.app.USER_READS`` (``/agents(/.*)?``, written for the agents'
    definitions before the quality route existed) let a token's GET through. Bob's token is
    refused the report (403, as every tenant-wide route); the agent's definition it still reads."""
    api, tenant = api_stack, f"eu-quality-{uuid.uuid4().hex[:6]}"
    key = api.stack.create_api_key(tenant)
    alice = api.stack.token(user="alice", tenant=tenant)
    bob = api.stack.token(user="bob", tenant=tenant)
    name = f"graded-{uuid.uuid4().hex[:6]}"
    made = {"name": name, "provider": "scripted", "script": {"turns": [{"text": "DONE"}]}, "system": "s"}
    assert api.http("POST", "/agents", made, key=key)[0] == 201
    alias = {"versions": [{"version": 1, "weight": 100}], "online": {"rate": 1, "grade": {"grader": "says_done"}}}
    assert api.http("PUT", f"/agents/{name}/aliases/prod", alias, key=key)[0] == 200
    for _ in range(2):
        task_id = api.submit({"goal": "alice's own question", "agent": f"{name}@prod"}, key=alice)
        api.until(task_id, lambda v: v["status"] == "succeeded", key=alice)
    deadline = time.monotonic() + 60
    while True:  # the tenant's key sees both of alice's tasks graded
        report = api.http("GET", f"/agents/{name}/quality?hours=2", key=key)[1]
        if sum(b["graded"] for b in report["buckets"]) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sum(b["graded"] for b in report["buckets"]) == 2, report

    status, seen, _ = api.http("GET", f"/agents/{name}/quality?hours=2", key=bob)
    assert status == 403 and seen["error"]["code"] == "forbidden", f"bob's token read alice's graded tasks: {seen}"
    for path in (f"/agents/{name}", f"/agents/{name}/versions", "/agents"):
        assert api.http("GET", path, key=bob)[0] == 200, path
