"""Caps per end user, agent and API key over the API and the CLI (``/caps``, ``agentq caps``), on
the local stack with auth on and its real workers: a cap written through the API holds a real
task acting for its scope (deferred at the cap, its windows exact), bad caps are a 422 naming the
field and store nothing, and no tenant reads, writes or is held by another's caps."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

import pytest

from tests.api_support import ApiStack
from tests.helpers import call, run_agentq

NOTES = "n" * 800


def _long(turns: int = 30, **extra: Any) -> dict[str, Any]:
    script = [{"text": f"turn {i} {NOTES}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(turns)]
    return {"goal": "spend", "provider": "scripted", "script": {"turns": [*script, {"text": "done"}]},
            "constraints": {"tools": ["lookup"], "max_steps": 100, "max_output_tokens": 300, "max_cost_usd": "5"}, **extra}  # fmt: skip


def _caps(api: ApiStack, key: str) -> list[dict[str, Any]]:
    status, listed, _ = api.http("GET", "/caps", key=key)
    assert status == 200, listed
    return list(listed["caps"])


def test_a_cap_written_through_the_api_holds_a_real_task_of_its_user_and_shows_its_windows(
    api_stack: ApiStack,
) -> None:
    api = api_stack
    key = api.stack.create_api_key("caps-run", act_for_users=True)
    status, cap, _ = api.http("PUT", "/caps/user/ivy", {"hourly_tokens": 5_000, "daily_usd": "2"}, key=key)
    assert status == 200 and cap["limits"]["hourly_tokens"] == 5_000 and cap["hour"]["tokens"] == 0, cap
    task_id = api.submit(_long(user="ivy"), key=key)
    view = api.until(task_id, lambda v: (v.get("retry") or {}).get("error", {}).get("code") == "cap_reached", key=key)
    assert view["status"] == "running" and view["retry"]["scope"] == "deferral"
    assert "user 'ivy' reached its cap of 5000 tokens an hour" in view["retry"]["error"]["message"]
    status, shown, _ = api.http("GET", "/caps/user/ivy", key=key)
    assert status == 200
    assert shown["hour"]["tokens"] == shown["hour"]["used_tokens"] == view["budget"]["used"] <= 5_000
    assert (
        shown["day"]["tokens"] == shown["hour"]["tokens"]
        and Decimal(shown["day"]["used_usd"]) == Decimal(view["budget"]["money"]["used_usd"]) > 0
    )
    # A raise lets it go on at its next look (the deferral comes back within 15 minutes: here, we cancel).
    assert api.http("POST", f"/tasks/{task_id}/cancel", {}, key=key)[0] == 200


BAD: list[tuple[dict[str, Any], str]] = [
    *[({f: -1}, f) for f in ("hourly_tokens", "daily_tokens", "hourly_usd", "daily_usd")],
    *[
        ({f.removeprefix("soft_"): 10, f: -1}, f)
        for f in ("soft_hourly_tokens", "soft_daily_tokens", "soft_hourly_usd", "soft_daily_usd")
    ],
    *[
        ({f.removeprefix("soft_"): 10, f: 11}, f)
        for f in ("soft_hourly_tokens", "soft_daily_tokens", "soft_hourly_usd", "soft_daily_usd")
    ],
    ({"soft_daily_usd": "1"}, "soft_daily_usd"),  # a threshold without its cap
    # a token count is a JSON integer: lax, true was a cap of 1 token and false of 0 (every task held)
    *[({f: v}, f) for f in ("hourly_tokens", "daily_tokens") for v in (True, False, "7")],
    *[
        ({f.removeprefix("soft_"): 10, f: v}, f)
        for f in ("soft_hourly_tokens", "soft_daily_tokens")
        for v in (True, "7")
    ],
    ({"hourly_tokens": 1.5}, "hourly_tokens"),
    ({"hourly_usd": "0.0000001"}, "hourly_usd"),  # finer than a millionth
    ({"hourly_tokens": 10, "weekly_tokens": 5}, "weekly_tokens"),
    ({}, "body"),
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_a_bad_cap_is_a_422_naming_the_field_and_stores_nothing(
    api_stack: ApiStack, body: dict[str, Any], field: str
) -> None:
    key = api_stack.stack.create_api_key(f"caps-bad-{uuid.uuid4().hex[:6]}")
    status, answer, _ = api_stack.http("PUT", "/caps/user/ivy", body, key=key)
    assert status == 422 and answer["error"]["field"] == field, answer
    assert _caps(api_stack, key) == []


@pytest.mark.parametrize(("path", "field"), [("/caps/team/ivy", "scope"), ("/caps/users/ivy", "scope"),
                                             ("/caps/user/-ivy", "name"), ("/caps/user/a%20b", "name")])  # fmt: skip
def test_an_unknown_scope_or_a_bad_name_is_a_422_naming_it_and_stores_nothing(
    api_stack: ApiStack, path: str, field: str
) -> None:
    key = api_stack.stack.create_api_key(f"caps-scope-{uuid.uuid4().hex[:6]}")
    status, answer, _ = api_stack.http("PUT", path, {"hourly_tokens": 10}, key=key)
    assert status == 422 and answer["error"]["field"] == field, answer
    assert api_stack.http("GET", path, key=key)[0] == 422
    assert _caps(api_stack, key) == []


def test_no_tenant_reads_writes_or_is_held_by_another_tenants_caps(api_stack: ApiStack) -> None:
    api = api_stack
    a, b = (
        api.stack.create_api_key("caps-a", act_for_users=True),
        api.stack.create_api_key("caps-b", act_for_users=True),
    )
    assert api.http("PUT", "/caps/user/jo", {"hourly_tokens": 0}, key=a)[0] == 200
    assert api.http("PUT", "/caps/agent/helper", {"daily_usd": "0"}, key=a)[0] == 200
    assert _caps(api, b) == []
    for method in ("GET", "DELETE"):
        status, answer, _ = api.http(method, "/caps/user/jo", key=b)
        assert status == 404 and answer["error"]["code"] == "cap_not_found", answer
    done = api.submit({**_long(turns=2), "user": "jo"}, key=b)  # b's jo is not a's jo
    assert api.until(done, lambda v: v["status"] == "succeeded", key=b)["budget"]["used"] > 0
    assert [(c["scope"], c["name"], c["hour"]["tokens"]) for c in _caps(api, a)] == [("agent", "helper", 0),
                                                                                     ("user", "jo", 0)]  # fmt: skip
    token = api.stack.token(user="jo", tenant="caps-a")  # a user's token manages no caps, its own included
    for method, body in (("GET", None), ("PUT", {"hourly_tokens": 10**9})):
        status, answer, _ = api.http(method, "/caps/user/jo", body, key=token)
        assert status == 403 and answer["error"]["code"] == "forbidden", answer
    shown = {k: [(c["scope"], c["name"]) for c in api.http("GET", "/usage", key=k)[1]["caps"]] for k in (a, b, token)}
    assert shown == {a: [("agent", "helper"), ("user", "jo")], b: [], token: [("user", "jo")]}  # GET /usage too
    status, gone, _ = api.http("DELETE", "/caps/user/jo", key=a)
    assert status == 200 and gone["limits"]["hourly_tokens"] == 0
    assert [c["name"] for c in _caps(api, a)] == ["helper"]


def test_agentq_caps_set_and_list_round_trip_and_a_bad_one_exits_naming_the_field(api_stack: ApiStack) -> None:
    key = api_stack.stack.create_api_key(f"caps-cli-{uuid.uuid4().hex[:6]}")
    env = api_stack.cli_env(AGENTQ_API_KEY=key)
    done = run_agentq(["caps", "set", "key", "k-1", "--daily-usd", "5", "--soft-daily-usd", "3",
                       "--hourly-tokens", "100000"], env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed = run_agentq(["caps", "list", "--json"], env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    (cap,) = json.loads(listed.stdout)["caps"]
    assert (cap["scope"], cap["name"]) == ("key", "k-1")
    assert cap["limits"]["daily_usd"] == "5" and cap["limits"]["soft_daily_usd"] == "3"
    table = run_agentq(["caps", "list"], env, timeout=60)
    assert "k-1" in table.stdout and "100000" in table.stdout
    bad = run_agentq(["caps", "set", "user", "u", "--hourly-tokens", "10", "--soft-hourly-tokens", "20"], env,
                     timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "soft_hourly_tokens" in bad.stderr
    assert [c["name"] for c in json.loads(run_agentq(["caps", "list", "--json"], env, timeout=60).stdout)["caps"]] == [
        "k-1"
    ]


def test_an_agents_cap_holds_every_version_of_it_and_a_rule_sees_the_submitting_key(api_stack: ApiStack) -> None:
    """A task of an agent runs as ``name@version``: the agent's caps are the name's, whatever the
    version. The key a tree was submitted with is the policy principal's ``api_key`` (a user's
    token has none)."""
    api = api_stack
    key = api.stack.create_api_key("caps-agent", act_for_users=True)
    name = f"capped-{uuid.uuid4().hex[:6]}"
    body = {"name": name, "provider": "scripted", "script": {"turns": [{"text": "hi"}]}}
    assert api.http("POST", "/agents", body, key=key)[0] == 201
    assert api.http("PUT", f"/caps/agent/{name}", {"hourly_tokens": 0}, key=key)[0] == 200
    held = api.submit({"goal": "hi", "agent": name}, key=key)
    view = api.until(held, lambda v: (v.get("retry") or {}).get("error", {}).get("code") == "cap_reached", key=key)
    said = view["retry"]["error"]["message"]  # a cap of 0 holds back every call, and says so
    assert f"agent {name!r}: this call holds" in said and "it can never run under it" in said and view["step"] == 0
    assert api.http("POST", f"/tasks/{held}/cancel", {}, key=key)[0] == 200

    other = f"keyed-{uuid.uuid4().hex[:6]}"
    assert api.http("POST", "/agents", {**body, "name": other}, key=key)[0] == 201
    rule = '@id("keys-off") forbid(principal, action == Action::"model", resource) when { context has api_key };'
    assert api.http("PUT", f"/policies/agent:{other}", {"policies": rule}, key=key)[0] in (200, 201)
    by_key = api.submit({"goal": "hi", "agent": other}, key=key)
    denied = api.until(by_key, lambda v: v["status"] == "failed", key=key)
    assert denied["error"]["code"] == "policy_denied" and "keys-off" in denied["error"]["message"]
    token = api.stack.token(user="kim", tenant="caps-agent")
    by_token = api.submit({"goal": "hi", "agent": other}, key=token)
    assert api.until(by_token, lambda v: v["status"] in ("succeeded", "failed"), key=token)["status"] == "succeeded"
