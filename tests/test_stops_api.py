"""The stop button over HTTP (issue 44 item 3), on the local stack with auth on: each scope kind
stops exactly its own tasks and refuses new ones with 423 naming the scope until resumed; bad
input is a 4xx naming the field with nothing stored; a tenant never reaches another's tasks.

Every test uses tenants of its own (a stop refuses a whole scope: the shared stack's other
tests must never meet one)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.api_support import ApiStack

# A task that stays unfinished while the test looks: a long first turn.
SLOW = {"goal": "slow", "provider": "scripted", "script": {"turns": [{"text": "zzz", "latency_seconds": 20}]}}


def _tenant(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _key_id(api: ApiStack, key: str) -> str:
    found = api.stack.keys().lookup(key)
    assert found is not None
    return found.key_id


def _status(api: ApiStack, task_id: str, key: str) -> str:
    status, view, _ = api.http("GET", f"/tasks/{task_id}", key=key)
    assert status == 200, view
    return str(view["status"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"team": "x"}, "team"),  # no such scope kind
        ({}, "scope"),  # none
        ({"user": "alice", "agent": "shop"}, "agent"),  # more than one
        ({"user": "alice", "tenant": "t"}, "tenant"),
        ({"user": ""}, "user"),  # empty
        ({"agent": ""}, "agent"),
        ({"key": ""}, "key"),
        ({"tenant": ""}, "tenant"),
        ({"user": "a b"}, "user"),  # not a name of its kind
        ({"agent": "Shop!"}, "agent"),
        ({"key": "k-1"}, "key"),
        ({"user": None, "agent": None}, "scope"),
        ({"user": "alice", "reason": "x" * 501}, "reason"),
    ],
)
def test_a_stop_naming_no_single_valid_scope_is_a_4xx_naming_the_field_and_stores_nothing(
    api_stack: ApiStack, body: dict[str, Any], field: str
) -> None:
    key = api_stack.stack.create_api_key(_tenant("stop-bad"))
    for path in ("/stops", "/stops/resume"):
        if path.endswith("resume") and "reason" in body:
            continue
        status, answer, _ = api_stack.http("POST", path, body, key=key)
        assert status in (400, 422), answer
        assert answer["error"]["field"] == field, answer
    assert api_stack.http("GET", "/stops", key=key)[1] == {"stops": []}


def test_a_stopped_user_is_cancelled_and_refused_with_423_naming_it_until_resumed(api_stack: ApiStack) -> None:
    tenant = _tenant("stop-user")
    key = api_stack.stack.create_api_key(tenant, act_for_users=True)
    alice = [api_stack.submit({**SLOW, "user": "alice"}, key=key) for _ in range(3)]
    bob = api_stack.submit({**SLOW, "user": "bob"}, key=key)

    status, answer, _ = api_stack.http("POST", "/stops", {"user": "alice", "reason": "runaway"}, key=key)
    assert status == 200, answer
    assert answer["created"] is True and sorted(answer["cancelled"]) == sorted(alice)
    assert answer["stop"]["kind"] == "user" and answer["stop"]["value"] == "alice"
    assert answer["stop"]["by"] == _key_id(api_stack, key) and answer["stop"]["reason"] == "runaway"
    assert all(_status(api_stack, t, key) == "cancelled" for t in alice)
    assert _status(api_stack, bob, key) in ("queued", "running")

    refused = api_stack.http("POST", "/tasks", {**SLOW, "user": "alice"}, key=key)
    assert refused[0] == 423, refused
    assert refused[1]["error"]["code"] == "scope_stopped"
    assert refused[1]["error"]["scope"] == {"kind": "user", "value": "alice"}
    assert refused[1]["error"]["field"] == "user"
    follow_up = api_stack.http("POST", f"/tasks/{alice[0]}/messages", {"text": "go on"}, key=key)
    assert follow_up[0] == 423 and follow_up[1]["error"]["scope"]["value"] == "alice", follow_up
    assert api_stack.http("POST", "/tasks", {**SLOW, "user": "bob"}, key=key)[0] == 202  # bob is not stopped

    again = api_stack.http("POST", "/stops", {"user": "alice"}, key=key)[1]
    assert again["created"] is False and again["cancelled"] == [] and again["stop"]["reason"] == "runaway"
    assert [s["value"] for s in api_stack.http("GET", "/stops", key=key)[1]["stops"]] == ["alice"]

    status, resumed, _ = api_stack.http("POST", "/stops/resume", {"user": "alice"}, key=key)
    assert status == 200 and resumed["resumed"]["value"] == "alice"
    assert api_stack.http("POST", "/tasks", {**SLOW, "user": "alice"}, key=key)[0] == 202
    assert all(_status(api_stack, t, key) == "cancelled" for t in alice)  # a resume revives nothing
    gone = api_stack.http("POST", "/stops/resume", {"user": "alice"}, key=key)
    assert gone[0] == 404 and gone[1]["error"]["field"] == "user"
    api_stack.http("POST", "/stops", {"tenant": tenant}, key=key)  # leave nothing running behind


def test_a_stopped_key_stops_only_the_tasks_submitted_with_it(api_stack: ApiStack) -> None:
    tenant = _tenant("stop-key")
    first, second = api_stack.stack.create_api_key(tenant), api_stack.stack.create_api_key(tenant)
    mine = [api_stack.submit(SLOW, key=first) for _ in range(2)]
    theirs = api_stack.submit(SLOW, key=second)
    status, answer, _ = api_stack.http("POST", "/stops", {"key": _key_id(api_stack, first)}, key=second)
    assert status == 200 and sorted(answer["cancelled"]) == sorted(mine), answer
    assert _status(api_stack, theirs, second) in ("queued", "running")
    assert api_stack.http("POST", "/tasks", SLOW, key=first)[0] == 423
    assert api_stack.http("POST", "/tasks", SLOW, key=second)[0] == 202
    assert api_stack.http("POST", "/stops/resume", {"key": _key_id(api_stack, first)}, key=first)[0] == 200
    assert api_stack.http("POST", "/tasks", SLOW, key=first)[0] == 202
    api_stack.http("POST", "/stops", {"tenant": tenant}, key=first)


def test_a_stopped_agent_stops_every_version_of_it_and_nothing_else(api_stack: ApiStack) -> None:
    tenant = _tenant("stop-agent")
    key = api_stack.stack.create_api_key(tenant)
    for name in ("shopper", "helper"):
        spec = {"name": name, "provider": "scripted", "script": SLOW["script"], "system": f"You are {name}."}
        assert api_stack.http("POST", "/agents", spec, key=key)[0] in (200, 201)
    shoppers = [api_stack.submit({"goal": "buy", "agent": "shopper"}, key=key) for _ in range(2)]
    helper = api_stack.submit({"goal": "help", "agent": "helper"}, key=key)
    answer = api_stack.http("POST", "/stops", {"agent": "shopper"}, key=key)[1]
    assert sorted(answer["cancelled"]) == sorted(shoppers), answer
    assert _status(api_stack, helper, key) in ("queued", "running")
    refused = api_stack.http("POST", "/tasks", {"goal": "buy", "agent": "shopper@1"}, key=key)
    assert refused[0] == 423 and refused[1]["error"]["scope"] == {"kind": "agent", "value": "shopper"}
    api_stack.http("POST", "/stops", {"tenant": tenant}, key=key)


def test_a_tenant_stops_only_its_own_scopes_and_never_touches_another_tenants_tasks(api_stack: ApiStack) -> None:
    mine, theirs = _tenant("stop-iso-a"), _tenant("stop-iso-b")
    key = api_stack.stack.create_api_key(mine, act_for_users=True)
    other = api_stack.stack.create_api_key(theirs, act_for_users=True)
    their_tasks = [api_stack.submit({**SLOW, "user": "alice"}, key=other), api_stack.submit(SLOW, key=other)]

    # Another tenant's name, another tenant's key: refused, nothing stored, nothing cancelled.
    named = api_stack.http("POST", "/stops", {"tenant": theirs}, key=key)
    assert named[0] == 403 and named[1]["error"]["field"] == "tenant", named
    probed = api_stack.http("POST", "/stops", {"key": _key_id(api_stack, other)}, key=key)
    unknown = api_stack.http("POST", "/stops", {"key": "key_0123456789abcdef"}, key=key)
    assert probed[0] == unknown[0] == 404 and probed[1]["error"]["field"] == "key"  # no oracle
    assert probed[1]["error"]["message"].replace(_key_id(api_stack, other), "K") == unknown[1]["error"][
        "message"
    ].replace("key_0123456789abcdef", "K")
    assert api_stack.http("POST", "/stops/resume", {"tenant": theirs}, key=key)[0] == 403

    # The same user name and the whole tenant, stopped in mine: theirs run on and submit on.
    assert api_stack.http("POST", "/stops", {"user": "alice"}, key=key)[0] == 200
    everything = api_stack.http("POST", "/stops", {"tenant": mine}, key=key)
    assert everything[0] == 200 and everything[1]["cancelled"] == []
    assert all(_status(api_stack, t, other) in ("queued", "running") for t in their_tasks)
    assert api_stack.http("GET", "/stops", key=other)[1] == {"stops": []}
    assert api_stack.http("POST", "/tasks", {**SLOW, "user": "alice"}, key=other)[0] == 202
    assert api_stack.http("POST", "/tasks", SLOW, key=key)[0] == 423
    api_stack.http("POST", "/stops", {"tenant": theirs}, key=other)


def test_an_end_users_token_cannot_stop_or_resume(api_stack: ApiStack) -> None:
    tenant = _tenant("stop-token")
    token = api_stack.stack.token(user="alice", tenant=tenant)
    for method, path, body in (("POST", "/stops", {"user": "alice"}), ("POST", "/stops/resume", {"user": "alice"}),
                               ("GET", "/stops", None)):  # fmt: skip
        status, answer, _ = api_stack.http(method, path, body, key=token)
        assert status == 403, answer
    key = api_stack.stack.create_api_key(tenant)
    assert api_stack.http("GET", "/stops", key=key)[1] == {"stops": []}
