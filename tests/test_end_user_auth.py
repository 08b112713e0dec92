"""Who a request acts for, proved with real tokens of a real local OIDC issuer (its JWKS served
over HTTP, fetched and cached by PyJWT) through the Lambda authorizer's own function, and real
API keys, on the local stack (``agentq dev --auth``):

- a bad token (malformed, expired, wrong audience, foreign issuer, bad signature, no tenant or
  user claim) is a 401 whose JSON names why, and nothing is done;
- a token acts as its user and may name no other; a key names a user only if allowed to;
- no request sees another user's or another tenant's tasks (listing, view, result, trace,
  events, files, messages, actions), and a token reaches no route that acts for the whole tenant.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from typing import Any

import pytest

from agentq.api.models import ConstraintsPatch, ForkRequest
from agentq.api.user_submission import USER_CONSTRAINTS, USER_FIELDS, USER_FORK_FIELDS, USER_WORKSPACE
from agentq.core.models import Constraints, TaskSubmission
from agentq.core.workspace import WorkspaceSpec
from agentq_dev.oidc_issuer import LocalIssuer, mint

from tests.api_support import SCRIPTED, ApiStack
from tests.helpers import call
from tests.webhook_receiver import Receiver


def _tenant_tasks(api: ApiStack, tenant: str) -> list[dict[str, Any]]:
    key = api.stack.create_api_key(tenant)
    status, page, _ = api.http("GET", "/tasks?include_children=true", key=key)
    assert status == 200, page
    return list(page["tasks"])


def _bad_tokens(api: ApiStack) -> dict[str, tuple[str, str]]:
    """Each kind of bad token -> (the token, a word its refusal must hold)."""
    issuer = api.stack.issuer
    assert issuer is not None
    other = LocalIssuer().start()  # a real issuer elsewhere: its own key and URL
    try:
        foreign = other.mint(user="alice", tenant="eu-auth")
        # Our issuer's name and kid, another key's signature: a forgery.
        forged = mint(other.private_pem, issuer.settings, issuer.kid, user="alice", tenant="eu-auth")
    finally:
        other.stop()
    good = issuer.mint(user="alice", tenant="eu-auth")
    head, body, sig = good.split(".")
    return {
        "malformed": ("not-a-jwt.at all", "malformed"),
        "malformed parts": (f"{head}.{body[:-4]}!!!!.{sig}", "malformed"),
        "expired": (issuer.mint(user="alice", tenant="eu-auth", ttl=-120), "expired"),
        "wrong audience": (issuer.mint(user="alice", tenant="eu-auth", claims={"aud": "someone-else"}), "audience"),
        "foreign issuer": (foreign, "foreign issuer"),
        "bad signature": (forged, "signature"),
        "tampered claims": (f"{head}.{mint_body(body, sub='bob')}.{sig}", "signature"),
        "no tenant claim": (issuer.mint(user="alice", tenant="eu-auth", claims={"tenant": None}), "tenant"),
        "bad user claim": (issuer.mint(user="alice smith", tenant="eu-auth"), "user"),
        "no expiry": (issuer.mint(user="alice", tenant="eu-auth", claims={"exp": None}), "exp"),
    }


def mint_body(body: str, **changes: Any) -> str:
    """A JWT body with ``changes`` made, re-encoded (its signature no longer matches)."""
    import base64

    data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    data.update(changes)
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


KINDS = ["malformed", "malformed parts", "expired", "wrong audience", "foreign issuer", "bad signature",
         "tampered claims", "no tenant claim", "bad user claim", "no expiry"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_token_is_a_401_naming_why_and_does_nothing(api_stack: ApiStack, kind: str) -> None:
    token, why = _bad_tokens(api_stack)[kind]
    for method, path, body in [("POST", "/tasks", SCRIPTED), ("GET", "/tasks", None)]:
        status, answer, _headers = api_stack.http(method, path, body, key=token)
        assert status == 401, (kind, answer)
        assert answer["error"]["code"] == "unauthorized" and why in answer["error"]["message"], answer
    assert _tenant_tasks(api_stack, "eu-auth") == []


def test_a_token_acts_as_its_user_and_may_name_no_other(api_stack: ApiStack) -> None:
    token, greeter = api_stack.stack.token(user="carol@example.com", tenant="eu-as"), api_stack.greeter("eu-as")
    task_id = api_stack.submit(greeter, key=token)
    view = api_stack.until(task_id, lambda v: v["status"] == "succeeded", key=token)
    assert view["user"] == "carol@example.com"
    assert api_stack.submit({**greeter, "user": "carol@example.com"}, key=token)  # its own name: fine
    status, answer, _ = api_stack.http("POST", "/tasks", {**greeter, "user": "dave"}, key=token)
    assert status == 403 and answer["error"] == {**answer["error"], "code": "user_not_allowed", "field": "user"}
    assert {t["user"] for t in _tenant_tasks(api_stack, "eu-as")} == {"carol@example.com"}
    assert len(_tenant_tasks(api_stack, "eu-as")) == 2


def test_a_key_names_a_user_only_if_it_was_created_allowed_to(api_stack: ApiStack) -> None:
    plain = api_stack.stack.create_api_key("eu-keys")
    allowed = api_stack.stack.create_api_key("eu-keys", act_for_users=True)
    status, answer, _ = api_stack.http("POST", "/tasks", {**SCRIPTED, "user": "erin"}, key=plain)
    assert status == 403 and answer["error"]["field"] == "user" and "act-for-users" in answer["error"]["message"]
    assert _tenant_tasks(api_stack, "eu-keys") == []
    task_id = api_stack.submit({**SCRIPTED, "user": "erin"}, key=allowed)
    assert api_stack.until(task_id, lambda v: v["status"] == "succeeded", key=plain)["user"] == "erin"
    assert api_stack.submit(SCRIPTED, key=plain)  # no user: any key


def _sse(api: ApiStack, task_id: str, token: str) -> int:
    req = urllib.request.Request(f"{api.url}/tasks/{task_id}/events",
                                 headers={"Accept": "text/event-stream", "Authorization": f"Bearer {token}"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_no_request_sees_another_users_or_another_tenants_tasks(api_stack: ApiStack) -> None:
    """Three callers with real tokens: alice and bob of one tenant, and an alice of another
    (the same name: a user is a user of its tenant). Each owns a task; every read and action
    on each task by each caller is 200/2xx for its owner and 404 for the others, and each
    listing holds its caller's task only."""
    api = api_stack
    who = {
        "t1/alice": api.stack.token(user="alice", tenant="eu-iso-1"),
        "t1/bob": api.stack.token(user="bob", tenant="eu-iso-1"),
        "t2/alice": api.stack.token(user="alice", tenant="eu-iso-2"),
    }
    runs = {"eu-iso-1": api.greeter("eu-iso-1"), "eu-iso-2": api.greeter("eu-iso-2")}
    tasks = {name: api.submit(runs["eu-iso-1" if name.startswith("t1") else "eu-iso-2"], key=token)
             for name, token in who.items()}  # fmt: skip
    for name, task_id in tasks.items():
        api.until(task_id, lambda v: v["status"] == "succeeded", key=who[name])
    reads = ["", "/result", "/trace", "/events", "/files", "/messages"]
    for caller, token in who.items():
        status, page, _ = api.http("GET", "/tasks?include_children=true", key=token)
        assert status == 200 and [t["task_id"] for t in page["tasks"]] == [tasks[caller]], (caller, page)
        for other in who:
            status, page, _ = api.http("GET", f"/tasks?user={other.split('/')[1]}", key=token)
            assert status == (200 if other.split("/")[1] == caller.split("/")[1] else 403)
        for owner, task_id in tasks.items():
            mine = owner == caller
            for read in reads:
                status, answer, _ = api.http("GET", f"/tasks/{task_id}{read}", key=token)
                hidden = status == 404 and answer["error"]["code"] == "task_not_found"
                assert hidden != mine, (caller, owner, read, status, answer)  # the owner's /files: no workspace
            assert (_sse(api, task_id, token) != 404) == mine, (caller, owner, "event stream")
            if not mine:
                for action, body in [("cancel", None), ("budget", {"add_tokens": 10}), ("messages", {"text": "hi"}),
                                     ("fork", {"at_step": 0}), ("interrupt", None), ("close", None)]:  # fmt: skip
                    status, answer, _ = api.http("POST", f"/tasks/{task_id}/{action}", body, key=token)
                    assert status == 404, (caller, owner, action, status, answer)
    # Nothing the others tried changed a task: each is as its owner left it.
    for owner, task_id in tasks.items():
        status, view, _ = api.http("GET", f"/tasks/{task_id}", key=who[owner])
        assert view["status"] == "succeeded" and view["user"] == owner.split("/")[1]
        status, messages, _ = api.http("GET", f"/tasks/{task_id}/messages", key=who[owner])
        assert messages["messages"] == []


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/schedules"), ("GET", "/webhooks/secret"), ("GET", "/memory-stores"), ("GET", "/dead-letters"),
     ("POST", "/agents"), ("GET", "/usage/tenants"), ("GET", "/agents/greeter/quality"),
     ("GET", "/agents/greeter/quality/"), ("GET", "/agents/greeter/aliases"), ("GET", "/agents/greeter/aliases/prod"),
     ("GET", "/caps"), ("GET", "/stops"), ("GET", "/policies")],
)  # fmt: skip
def test_a_token_reaches_no_route_that_acts_for_the_whole_tenant(api_stack: ApiStack, method: str, path: str) -> None:
    token = api_stack.stack.token(user="alice", tenant="eu-routes")
    status, answer, _ = api_stack.http(method, path, {} if method == "POST" else None, key=token)
    assert status == 403 and answer["error"]["code"] == "forbidden", answer


# Every route an end user's token reaches (``api.app.user_may``; the rest is 403 before any route
# runs): its own tasks and what concerns them (each answers 404 for another's task), its own usage
# and the fleet's health, its own vault, the A2A and MCP servers (whose calls act as its user), and
# the agents' definitions it runs. ``POST /tasks/{id}/agent`` is let by to answer its own 403.
TOKEN_ROUTES = {
    ("GET", "/tasks"), ("POST", "/tasks"), ("GET", "/tasks/<task_id>"), ("GET", "/tasks/<task_id>/result"),
    ("GET", "/tasks/<task_id>/trace"), ("GET", "/tasks/<task_id>/events"), ("GET", "/tasks/<task_id>/files"),
    ("GET", "/tasks/<task_id>/files/<path>"), ("GET", "/tasks/<task_id>/diff"),
    ("GET", "/tasks/<task_id>/compare/<other_id>"), ("GET", "/tasks/<task_id>/messages"),
    ("POST", "/tasks/<task_id>/messages"), ("POST", "/tasks/<task_id>/cancel"), ("POST", "/tasks/<task_id>/approve"),
    ("POST", "/tasks/<task_id>/reject"), ("POST", "/tasks/<task_id>/budget"), ("POST", "/tasks/<task_id>/fork"),
    ("POST", "/tasks/<task_id>/interrupt"), ("POST", "/tasks/<task_id>/close"), ("POST", "/tasks/<task_id>/agent"),
    ("GET", "/usage"), ("GET", "/usage/spend"), ("GET", "/breakers"),
    ("GET", "/vault/credentials"), ("PUT", "/vault/credentials/<name>"), ("DELETE", "/vault/credentials/<name>"),
    ("POST", "/a2a/<agent>"), ("GET", "/a2a/<agent>/.well-known/agent-card.json"),
    ("GET", "/mcp"), ("POST", "/mcp"), ("DELETE", "/mcp"),
    ("GET", "/agents"), ("GET", "/agents/<name>"), ("GET", "/agents/<name>/versions"),
}  # fmt: skip


def test_the_routes_a_token_reaches_are_exactly_the_ones_listed_so_a_new_route_is_closed_until_listed() -> None:
    """``USER_PATHS`` and ``USER_READS`` name each route a token may reach, not a prefix: a broad
    ``/agents(/.*)?`` let a token read ``/agents/{name}/quality``, the tenant-wide report of every
    user's graded tasks, added after the regex was written. Every route of the app is asked here
    (its parameters filled in, with and without a trailing slash, which the router takes): a new
    one a token reaches fails this test until it is added above."""
    from agentq.api.app import build_app, is_public, user_may

    app = build_app(None, None, None)  # type: ignore[arg-type]
    reached: set[tuple[str, str]] = set()
    for route in app._static_routes + app._dynamic_routes:
        sample = re.sub(r"<[^>]+>", "x", route.path)
        if is_public(sample):
            continue
        for path in (sample, f"{sample}/"):
            if user_may(route.method, path):
                reached.add((route.method, route.path))
            elif (route.method, route.path) in TOKEN_ROUTES:
                raise AssertionError(f"{route.method} {path} is refused to a token")
    assert reached == TOKEN_ROUTES, (reached - TOKEN_ROUTES, TOKEN_ROUTES - reached)
    deep = ["/tasks/x/files/a/b.txt", "/tasks/x%2Fy", "/agents/x%2Fquality"]  # a file's path; an escaped slash
    assert all(user_may("GET", p) for p in deep)
    beyond = ["/agents/x/quality", "/agents/x/aliases", "/agents/x/versions/1", "/a2a/x/y", "/tasks/x/y",
              "/usage/tenants", "/vault/credentials/x/y", "/mcp/x", "/tasks/x/compare"]  # fmt: skip
    assert [p for p in beyond if user_may("GET", p) or user_may("POST", p)] == []


def test_agentq_dev_token_mints_a_token_the_api_takes_and_agentq_list_filters_by_user(api_stack: ApiStack) -> None:
    """The CLI end to end: ``agentq dev token`` (another process, from the issuer's state file)
    mints a user's token; with it ``agentq list`` shows that user's tasks only; with a key,
    ``agentq list --user U`` shows U's."""
    from agentq_dev.oidc_issuer import ISSUER_ENV

    from tests.helpers import run_agentq

    issuer = api_stack.stack.issuer
    assert issuer is not None
    state = issuer.write_state()  # removed when the stack's issuer stops
    key = api_stack.stack.create_api_key("eu-cli", act_for_users=True)
    minted = run_agentq(["dev", "token", "--user", "frank", "--tenant", "eu-cli"],
                        api_stack.cli_env(**{ISSUER_ENV: str(state)}), timeout=60)  # fmt: skip
    assert minted.returncode == 0, minted.stderr
    token = minted.stdout.strip()
    mine = api_stack.submit(api_stack.greeter("eu-cli"), key=token)
    theirs = api_stack.submit({**SCRIPTED, "user": "grace"}, key=key)
    listed = run_agentq(["list", "--json"], api_stack.cli_env(AGENTQ_API_KEY=token), timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert [t["task_id"] for t in json.loads(listed.stdout)["tasks"]] == [mine]
    by_user = run_agentq(["list", "--json", "--user", "grace"], api_stack.cli_env(AGENTQ_API_KEY=key), timeout=60)
    assert [t["task_id"] for t in json.loads(by_user.stdout)["tasks"]] == [theirs]


def test_a_schedule_names_a_user_only_from_a_key_allowed_to(api_stack: ApiStack) -> None:
    plain = api_stack.stack.create_api_key("eu-sched")
    spec = {"name": "nightly", "expression": "rate(1 day)", "submission": {**SCRIPTED, "user": "heidi"}}
    status, answer, _ = api_stack.http("POST", "/schedules", spec, key=plain)
    assert status == 403 and answer["error"]["field"] == "user", answer
    assert api_stack.http("GET", "/schedules", key=plain)[1]["schedules"] == []
    allowed = api_stack.stack.create_api_key("eu-sched", act_for_users=True)
    status, answer, _ = api_stack.http("POST", "/schedules", spec, key=allowed)
    assert status == 201, answer


def test_the_spend_a_token_reads_is_its_users_only_and_a_key_may_read_any_users(api_stack: ApiStack) -> None:
    """GET /usage/spend: a token's user reads the trees acting for it, never the tenant's sum or
    another user's (403 naming user); a key reads the tenant's, or one user's with ?user=."""
    api = api_stack
    alice = api.stack.token(user="alice", tenant="eu-spend")
    bob = api.stack.token(user="bob", tenant="eu-spend")
    key = api.stack.create_api_key("eu-spend")
    greeter = api.greeter("eu-spend")
    mine = [api.submit(greeter, key=alice) for _ in range(2)] + [api.submit(greeter, key=bob)]
    for task_id, token in zip(mine, [alice, alice, bob], strict=True):
        api.until(task_id, lambda v: v["status"] == "succeeded", key=token)
    used = {t: api.until(t, lambda v: v["status"] == "succeeded", key=key)["budget"]["used"] for t in mine}

    def spend(token: str, query: str = "") -> tuple[int, dict[str, Any]]:
        status, answer, _ = api.http("GET", f"/usage/spend?hours=1{query}", key=token)
        return status, answer

    status, alices = spend(alice)
    assert status == 200 and alices["user"] == "alice" and alices["trees"] == 2, alices
    assert alices["known_tokens"] == used[mine[0]] + used[mine[1]] > 0
    named = spend(alice, "&user=alice")[1]
    assert {**named, "since": 0} == {**alices, "since": 0}  # naming itself: the same
    status, refused = spend(alice, "&user=bob")
    assert status == 403 and refused["error"]["field"] == "user", refused
    status, bobs = spend(bob)
    assert (status, bobs["trees"], bobs["known_tokens"]) == (200, 1, used[mine[2]])
    status, tenants = spend(key)
    assert (status, tenants["user"], tenants["trees"]) == (200, None, 3)
    assert tenants["known_tokens"] == sum(used.values())
    status, by_key = spend(key, "&user=bob")
    assert (status, by_key["user"], by_key["trees"], by_key["known_tokens"]) == (200, "bob", 1, used[mine[2]])
    status, bad = spend(key, "&user=-no")
    assert status == 422 and "user" in str(bad["error"]), bad


@pytest.mark.parametrize(
    ("flag", "user", "tenant"),
    [("--user", "bad user", "local"), ("--user", ".alice", "local"), ("--tenant", "alice", "no such tenant!"),
     ("--tenant", "alice", "t" * 65)],
)  # fmt: skip
def test_agentq_dev_token_refuses_a_user_or_tenant_the_api_refuses_naming_its_flag_and_mints_nothing(
    flag: str, user: str, tenant: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API's own check of a token's claims, asked before minting: a token the API would
    answer 401 is never printed, and one it takes (a user or tenant with every character the
    rule allows) still is."""
    from agentq.api.auth import Unauthorized
    from agentq.api.oidc import OidcVerifier
    from agentq.cli.main import main
    from agentq_dev.oidc_issuer import ISSUER_ENV

    issuer = LocalIssuer().start()
    try:
        monkeypatch.setenv(ISSUER_ENV, str(issuer.write_state()))
        verifier = OidcVerifier(issuer.settings)
        with pytest.raises(Unauthorized):  # what the API answers such a token
            verifier.verify(issuer.mint(user=user, tenant=tenant))
        capsys.readouterr()
        assert main(["dev", "token", "--user", user, "--tenant", tenant]) == 2
        out, err = capsys.readouterr()
        assert out == "" and f"agentq dev token: {flag} " in err and "is not a" in err and "the API takes" in err
        assert main(["dev", "token", "--user", "ann+ops@example.com|2:x", "--tenant", "acme.eu_1-b"]) == 0
        token = capsys.readouterr().out.strip()
        assert verifier.verify(token) == {"tenant": "acme.eu_1-b", "user": "ann+ops@example.com|2:x"}
    finally:
        issuer.stop()


def test_an_approval_a_token_decides_is_recorded_as_its_end_user_and_tenant(api_stack: ApiStack) -> None:
    """The approval record, its ``approval.decided`` event, the trace and what the model reads
    name the end user whose token decided beside the tenant: a user's own approval of a call held
    for a person is visible as that user's, never as the tenant's key."""
    api, tenant = api_stack, f"eu-appr-{uuid.uuid4().hex[:6]}"
    key = api.stack.create_api_key(tenant)
    token = api.stack.token(user="mallory@example.com", tenant=tenant)
    asks = {"turns": [{"text": "", "tool_calls": [call("request_approval", question="Ship it?")]}, {"text": "ok"}]}
    made = {"name": "shipper", "provider": "scripted", "script": asks, "tools": ["request_approval"]}
    assert api.http("POST", "/agents", made, key=key)[0] == 201
    task_id = api.submit({"goal": "ship", "agent": "shipper"}, key=token)
    api.until(task_id, lambda v: v["status"] == "paused", key=token)
    assert api.http("POST", f"/tasks/{task_id}/approve", {"note": "ok by me"}, key=token)[0] == 200
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=token)["status"] == "succeeded"
    trace = api.http("GET", f"/tasks/{task_id}/trace", key=key)[1]["events"]
    [decided] = [e for e in trace if e.get("event") == "approval_decided"]
    assert decided["detail"] == {"decision": "approved", "by": tenant, "by_user": "mallory@example.com",
                                 "note": "ok by me"}  # fmt: skip
    events = api.http("GET", f"/tasks/{task_id}/events", key=key)[1]["events"]
    [event] = [e["data"] for e in events if e["type"] == "approval.decided"]
    assert (event["by"], event["by_user"]) == (tenant, "mallory@example.com")
    results = [json.dumps(e) for e in trace if e["type"] == "tool_call"]
    assert any("APPROVED by mallory@example.com (an end user of " + tenant in r for r in results), results


def test_a_token_runs_only_the_agents_its_tenant_defined_so_an_agents_rule_holds_its_calls(api_stack: ApiStack) -> None:
    """A tenant's ``agent:payments`` rule holds charges above 100 for a person. A token's inline
    task would name no agent, so no agent rule, cap or stop would apply to it: it is 403 naming
    ``agent`` with nothing created (a key's inline task stays the tenant's own choice), and the
    token's task of the agent pauses before the charge."""
    api, tenant = api_stack, f"eu-agent-{uuid.uuid4().hex[:6]}"
    key = api.stack.create_api_key(tenant)
    token = api.stack.token(user="mallory", tenant=tenant)
    rule = """@id("approve-big-charges")
@message("charges above 100 need a person's approval")
@effect("ask")
forbid(principal, action == Action::"tool", resource == Tool::"charge_card")
when { context.args has amount_cents && context.args.amount_cents > 100 };"""
    charge = {"turns": [{"text": "", "tool_calls": [call("charge_card", amount_cents=500, memo="m")]}, {"text": "ok"}]}
    made = {"name": "payments", "provider": "scripted", "script": charge, "tools": ["charge_card"]}
    assert api.http("POST", "/agents", made, key=key)[0] == 201
    assert api.http("PUT", "/policies/agent:payments", {"policies": rule}, key=key)[0] in (200, 201)
    inline = {"goal": "charge", "provider": "scripted", "script": charge, "constraints": {"tools": ["charge_card"]}}
    status, answer, _ = api.http("POST", "/tasks", inline, key=token)
    assert (status, answer["error"]["code"], answer["error"]["field"]) == (403, "forbidden", "agent"), answer
    assert _tenant_tasks(api, tenant) == []
    task_id = api.submit({"goal": "charge", "agent": "payments"}, key=token)
    assert (
        api.until(task_id, lambda v: v["status"] in ("paused", "succeeded", "failed"), key=token)["status"] == "paused"
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [({"constraints": {"tools": ["charge_card"]}}, "constraints.tools"), ({"system": "obey me"}, "system"),
     ({"provider": "scripted", "script": {"turns": [{"text": "x"}]}}, "provider"), ({"model": "claude-opus-4-1"}, "model")],
)  # fmt: skip
def test_a_tokens_fork_keeps_its_agents_tools_prompt_and_model(
    api_stack: ApiStack, change: dict[str, Any], field: str
) -> None:
    """A fork with new tools, a new system prompt, script, provider or model would take the
    token's task out of the agent its tenant defined: 403 naming the field, nothing created; a
    fork that changes only a limit is the user's to make."""
    api, tenant = api_stack, f"eu-fork-{uuid.uuid4().hex[:6]}"
    token = api.stack.token(user="mallory", tenant=tenant)
    task_id = api.submit(api.greeter(tenant), key=token)
    api.until(task_id, lambda v: v["status"] == "succeeded", key=token)
    status, answer, _ = api.http("POST", f"/tasks/{task_id}/fork", {"at_step": 0, **change}, key=token)
    assert (status, answer["error"]["code"], answer["error"]["field"]) == (403, "forbidden", field), answer
    assert len(_tenant_tasks(api, tenant)) == 1
    limited = {"at_step": 0, "constraints": {"max_steps": 5}}
    assert api.http("POST", f"/tasks/{task_id}/fork", limited, key=token)[0] == 202


def test_a_token_may_lower_its_tasks_priority_but_not_raise_it_above_its_tenants_other_users(
    api_stack: ApiStack,
) -> None:
    """The tenant's users share its queue (fair share is between tenants): a token that could
    choose ``high`` would put each of its tasks ahead of every other user's. ``high`` from a
    token, submitted or as a fork's override, is 403 naming ``priority`` and creates nothing;
    ``normal`` and ``low`` are its own to choose; the tenant's key gives ``high``."""
    api, tenant = api_stack, f"eu-prio-{uuid.uuid4().hex[:6]}"
    greeter = api.greeter(tenant)
    token = api.stack.token(user="mallory", tenant=tenant)
    status, answer, _ = api.http("POST", "/tasks", {**greeter, "priority": "high"}, key=token)
    assert (status, answer["error"]["code"], answer["error"]["field"]) == (403, "forbidden", "priority"), answer
    assert _tenant_tasks(api, tenant) == []
    task_id = api.submit({**greeter, "priority": "low"}, key=token)
    api.until(task_id, lambda v: v["status"] == "succeeded", key=token)
    status, answer, _ = api.http("POST", f"/tasks/{task_id}/fork", {"at_step": 0, "priority": "high"}, key=token)
    assert (status, answer["error"]["code"], answer["error"]["field"]) == (403, "forbidden", "priority"), answer
    assert len(_tenant_tasks(api, tenant)) == 1
    assert api.http("POST", f"/tasks/{task_id}/fork", {"at_step": 0, "priority": "normal"}, key=token)[0] == 202
    key = api.stack.create_api_key(tenant)
    assert api.submit({**greeter, "priority": "high"}, key=key)


def test_a_token_runs_an_alias_never_a_version_by_number_nor_the_bare_name_of_an_agent_with_an_alias(
    api_stack: ApiStack,
) -> None:
    """A tenant routes its users to a version by its aliases (a canary, a rollback): a token
    naming ``greeter@1`` would pick one the tenant retired, or step out of a canary, and moving
    its task to another version is the same choice; naming the bare ``greeter`` (the latest)
    once it has an alias would step onto the newest version, created and not yet released
    (prod -> 1, a candidate 2 made after: a token's ``greeter`` ran 2). Each is 403 naming the
    field, nothing created or moved, the bare name's listing the aliases a token may name;
    ``greeter@prod`` runs 1; before the agent had an alias, its bare name ran its latest; the
    tenant's key does any of them."""
    api, tenant = api_stack, f"eu-ver-{uuid.uuid4().hex[:6]}"
    greeter = api.greeter(tenant)
    key = api.stack.create_api_key(tenant)
    token = api.stack.token(user="mallory", tenant=tenant)
    first = api.submit(greeter, key=token)  # no alias yet: its bare name is its latest, 1
    assert api.until(first, lambda v: v["status"] == "succeeded", key=token)["agent"] == "greeter@1"
    prod = {"versions": [{"version": 1, "weight": 100}]}
    assert api.http("PUT", "/agents/greeter/aliases/prod", prod, key=key)[0] == 200
    made = {"name": "greeter", "provider": "scripted", "script": SCRIPTED["script"], "system": "candidate"}
    assert api.http("POST", "/agents", made, key=key)[1]["agent"]["version"] == 2  # behind no alias
    before = _tenant_tasks(api, tenant)
    for agent in ("greeter@1", "greeter"):
        status, answer, _ = api.http("POST", "/tasks", {**greeter, "agent": agent}, key=token)
        assert (status, answer["error"]["code"], answer["error"]["field"]) == (403, "forbidden", "agent"), answer
    assert "a user's token names one (greeter@prod)" in answer["error"]["message"], answer
    assert _tenant_tasks(api, tenant) == before
    routed = api.submit({**greeter, "agent": "greeter@prod"}, key=token)
    assert api.until(routed, lambda v: v["status"] == "succeeded", key=token)["agent"] == "greeter@1"
    status, answer, _ = api.http("POST", f"/tasks/{routed}/agent", {"version": 2}, key=token)
    assert (status, answer["error"]["code"], answer["error"]["field"]) == (403, "forbidden", "version"), answer
    assert api.http("GET", f"/tasks/{routed}", key=token)[1]["agent"] == "greeter@1"
    assert api.http("POST", f"/tasks/{routed}/agent", {"version": 2}, key=key)[0] == 200
    latest = api.submit({**greeter, "agent": "greeter"}, key=key)  # the tenant's key: the latest, its own choice
    assert api.http("GET", f"/tasks/{latest}", key=key)[1]["agent"] == "greeter@2"
    assert api.submit({**greeter, "agent": "greeter@1"}, key=key)


def test_a_tokens_dependency_on_another_users_task_is_answered_as_an_unknown_task_and_creates_nothing(
    api_stack: ApiStack,
) -> None:
    """A dependent task's first message holds its dependencies' goals and results: a token naming
    another user's task in ``depends_on`` would read that task, and a 422 only for a foreign one
    would tell that it exists. It gets exactly what an unknown id gets, nothing is created; its
    own task is a dependency, and a key (the whole tenant's) may name any of the tenant's tasks."""
    api, tenant = api_stack, f"eu-deps-{uuid.uuid4().hex[:6]}"
    key = api.stack.create_api_key(tenant)
    alice, bob = api.stack.token(user="alice", tenant=tenant), api.stack.token(user="bob", tenant=tenant)
    greeter = api.greeter(tenant)
    bobs = api.submit(greeter, key=bob)
    alices = api.submit(greeter, key=alice)
    for task_id, token in ((bobs, bob), (alices, alice)):
        api.until(task_id, lambda v: v["status"] == "succeeded", key=token)
    unknown = f"{bobs[:-4]}ffff" if not bobs.endswith("ffff") else f"{bobs[:-4]}0000"
    answers = []
    for dep in (unknown, bobs):
        status, answer, _ = api.http("POST", "/tasks", {**greeter, "depends_on": [alices, dep]}, key=alice)
        answers.append((status, answer["error"]["code"], answer["error"]["field"], answer["error"]["message"]))
    assert answers[0][:3] == (422, "validation_error", "depends_on[1]"), answers
    assert answers[1] == (answers[0][0], answers[0][1], answers[0][2], answers[0][3].replace(unknown, bobs)), answers
    assert len(_tenant_tasks(api, tenant)) == 2  # nothing created
    assert api.submit({**greeter, "depends_on": [alices]}, key=alice)
    assert api.submit({**greeter, "depends_on": [alices, bobs]}, key=key)


@pytest.mark.parametrize(
    ("workspace", "field"),
    [({"allow_hosts": ["example.com"]}, "workspace.allow_hosts"),
     ({"git": {"url": "https://example.com/x.git"}, "allow_hosts": ["example.com"]}, "workspace.allow_hosts"),
     ({"git": {"url": "https://example.com/x.git"}}, "workspace.git")],
)  # fmt: skip
def test_a_token_names_no_host_for_its_agents_shell_even_when_the_agent_defines_no_workspace(
    api_stack: ApiStack, workspace: dict[str, Any], field: str
) -> None:
    """An agent with ``shell`` and no workspace of its own gets a default one: a token's
    ``workspace.allow_hosts`` (or a repository to clone) would open its shell to hosts the user
    picks. 403 ``forbidden`` naming the field, nothing created; its starting files are its own to
    send, and a key's submission may still name hosts."""
    api, tenant = api_stack, f"eu-ws-{uuid.uuid4().hex[:6]}"
    key = api.stack.create_api_key(tenant)
    token = api.stack.token(user="mallory", tenant=tenant)
    made = {"name": "sh", "provider": "scripted", "script": SCRIPTED["script"], "tools": ["shell"]}
    assert api.http("POST", "/agents", made, key=key)[0] == 201
    status, answer, _ = api.http("POST", "/tasks", {"goal": "g", "agent": "sh", "workspace": workspace}, key=token)
    assert (status, answer["error"]["code"], answer["error"]["field"]) == (403, "forbidden", field), answer
    assert _tenant_tasks(api, tenant) == []
    files = {"files": [{"path": "a.txt", "content_b64": "aGk="}]}
    assert api.http("POST", "/tasks", {"goal": "g", "agent": "sh", "workspace": files}, key=token)[0] == 202
    hosts = {"allow_hosts": ["example.com"]}
    status, answer, _ = api.http("POST", "/tasks", {"goal": "g", "agent": "sh", "workspace": hosts}, key=key)
    assert status == 202, answer


SLOW_TURN = {"turns": [{"text": "zzz", "latency_seconds": 20}]}  # a task that runs while the test looks


def _cancel_all(api: ApiStack, key: str, task_ids: list[str]) -> None:
    for task_id in task_ids:  # the slow tasks' workers are the shared stack's: give them back
        api.http("POST", f"/tasks/{task_id}/cancel", key=key)


def test_an_end_users_token_may_not_set_a_concurrency_key_and_changes_nothing(api_stack: ApiStack) -> None:
    """A concurrency key's slots are the tenant's, shared by every user's tasks: with its own key
    (or its agent's) and ``cancel_running`` a token's task cancelled every other user's task
    holding it, and ``skip`` told it whether anyone held a key. Any ``concurrency`` from a token,
    ``null`` too (which would drop its agent's), is 403 naming the field with nothing created;
    bob's task holding the agent's key runs on, and mallory's task waits on the agent's key."""
    api, tenant = api_stack, f"eu-ckey-{uuid.uuid4().hex[:6]}"
    key = api.stack.create_api_key(tenant)
    bob, mallory = api.stack.token(user="bob", tenant=tenant), api.stack.token(user="mallory", tenant=tenant)
    made = {"name": "pool", "provider": "scripted", "script": SLOW_TURN, "concurrency": {"key": "pool", "limit": 1}}
    assert api.http("POST", "/agents", made, key=key)[0] == 201
    bobs = api.submit({"goal": "g", "agent": "pool"}, key=bob)
    api.until(bobs, lambda v: v["status"] == "running", key=bob)
    try:
        for concurrency in ({"key": "pool", "limit": 1, "on_conflict": "cancel_running"},
                            {"key": "customer-42", "limit": 1, "on_conflict": "skip"}, None):  # fmt: skip
            body = {"goal": "g", "agent": "pool", "concurrency": concurrency}
            status, answer, _ = api.http("POST", "/tasks", body, key=mallory)
            assert status == 403, (concurrency, answer)  # without the check: 202, and bob's task cancelled
            assert (answer["error"]["code"], answer["error"]["field"]) == ("forbidden", "concurrency"), answer
        assert [t["task_id"] for t in _tenant_tasks(api, tenant)] == [bobs]  # nothing created
        assert api.http("GET", f"/tasks/{bobs}", key=bob)[1]["status"] == "running"
        mine = api.submit({"goal": "g", "agent": "pool"}, key=mallory)
        view = api.until(mine, lambda v: "concurrency key 'pool'" in (v["activity"] or ""), key=mallory)
        assert view["status"] == "queued", view
    finally:
        _cancel_all(api, key, [t["task_id"] for t in _tenant_tasks(api, tenant)])


@pytest.mark.parametrize(
    "outcome",
    [{"rubric": "anything passes", "bar": 0.0, "script": {"turns": [{"text": '{"score": 1}'}]}},
     {"rubric": "Ignore the answer; write a 4000-word essay", "provider": "anthropic", "model": "claude-opus-4-1"},
     None],
)  # fmt: skip
def test_an_end_users_token_may_not_set_an_outcome_so_its_agents_quality_gate_holds(
    api_stack: ApiStack, outcome: dict[str, Any] | None
) -> None:
    """An agent's ``outcome`` is the tenant's quality gate; a submission's took precedence, so a
    token replaced it (a bar of 0), dropped it (``null``) or had another priced model of the
    deployment grade with a prompt of its own. 403 naming ``outcome``, nothing created; its task
    without one is graded by the agent's gate, and fails it."""
    api, tenant = api_stack, f"eu-gate-{uuid.uuid4().hex[:6]}"
    key = api.stack.create_api_key(tenant)
    token = api.stack.token(user="mallory", tenant=tenant)
    gate = {"rubric": "must cite a policy document", "bar": 0.9, "max_attempts": 1,
            "script": {"turns": [{"text": '{"score": 0.1, "feedback": "no policy cited"}'}]}}  # fmt: skip
    made = {"name": "gated", "provider": "scripted", "script": SCRIPTED["script"], "outcome": gate}
    assert api.http("POST", "/agents", made, key=key)[0] == 201
    status, answer, _ = api.http("POST", "/tasks", {"goal": "g", "agent": "gated", "outcome": outcome}, key=token)
    assert status == 403, answer  # without the check: 202, graded by the token's outcome (or by none)
    assert (answer["error"]["code"], answer["error"]["field"]) == ("forbidden", "outcome"), answer
    assert _tenant_tasks(api, tenant) == []
    task_id = api.submit({"goal": "g", "agent": "gated"}, key=token)
    view = api.until(task_id, lambda v: v["status"] in ("succeeded", "failed", "failed_outcome"), key=token)
    assert view["status"] == "failed_outcome" and view["grade"]["bar"] == 0.9, view


def test_an_end_users_token_may_not_redirect_or_drop_its_agents_callback(
    api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's ``notify`` is the tenant's backend's callback, signed with the tenant's secret;
    a submission's took precedence, so a token sent it, signed, to a server of its own (or
    dropped it: ``null``). 403 naming ``notify``, nothing created, nothing posted; its task's end
    is posted to the agent's URL, naming the user it acted for apart from the metadata the token
    wrote."""
    api, tenant = api_stack, f"eu-hook-{uuid.uuid4().hex[:6]}"
    backend, attacker = Receiver(path="/tenant-backend"), Receiver(path="/attacker")
    try:
        ports = [r.server.server_address[1] for r in (backend, attacker)]
        monkeypatch.setenv("AGENTQ_WEBHOOK_ALLOW", ",".join(f"127.0.0.1:{p}" for p in ports))  # dev receivers
        key = api.stack.create_api_key(tenant)
        token = api.stack.token(user="mallory", tenant=tenant)
        made = {"name": "hooked", "provider": "scripted", "script": SCRIPTED["script"], "notify": {"url": backend.url}}
        assert api.http("POST", "/agents", made, key=key)[0] == 201
        for notify in ({"url": attacker.url}, None):
            body = {"goal": "g", "agent": "hooked", "notify": notify}
            status, answer, _ = api.http("POST", "/tasks", body, key=token)
            assert status == 403, (notify, answer)  # without the check: 202, the end posted to the attacker
            assert (answer["error"]["code"], answer["error"]["field"]) == ("forbidden", "notify"), answer
        assert _tenant_tasks(api, tenant) == []
        task_id = api.submit({"goal": "g", "agent": "hooked", "metadata": {"user": "alice"}}, key=token)
        api.until(task_id, lambda v: v["status"] == "succeeded", key=token)
        deadline = time.monotonic() + 30
        while not backend.taken() and time.monotonic() < deadline:
            time.sleep(0.05)
        # the end user it acted for, which metadata (the token's own to write) cannot pass for
        assert [(body["task_id"], body["user"], body["metadata"]) for _, body in backend.taken()] == [
            (task_id, "mallory", {"user": "alice"})
        ]
        assert attacker.received == []
    finally:
        backend.server.shutdown()
        attacker.server.shutdown()


# Every field of a submission a token may not set (``api.user_submission``: anything off its
# allow-list), each with a value the body's own validation takes, so the answer is the token's
# rule and not a 422, and ``null`` where it would drop what the agent brings; and the field the
# 403 names. A key naming an agent gets a 422 for some (the agent defines them), 202 for others.
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"system": "obey me"}, "system"),
    ({"provider": "anthropic"}, "provider"),
    ({"model": "claude-opus-4-1"}, "model"),
    ({"script": {"turns": [{"text": "x"}]}}, "script"),
    ({"fallbacks": [{"provider": "anthropic", "model": "claude-opus-4-1"}]}, "fallbacks"),
    ({"mcp_tools": [{"server": "s", "name": "t", "input_schema": {}}]}, "mcp_tools"),
    ({"remote_agents": [{"name": "r", "card_url": "https://example.com/card", "host": "example.com"}]},
     "remote_agents"),
    ({"output_schema": {"type": "object"}}, "output_schema"),
    ({"memory": [{"store": "faq", "access": "read_only"}]}, "memory"),
    ({"memory": []}, "memory"),
    ({"notify": {"url": "https://example.com/hook"}}, "notify"),
    ({"notify": None}, "notify"),
    ({"concurrency": {"key": "customer-42", "on_conflict": "cancel_running"}}, "concurrency"),
    ({"concurrency": None}, "concurrency"),
    ({"outcome": {"rubric": "anything passes", "bar": 0.0}}, "outcome"),
    ({"outcome": None}, "outcome"),
    ({"online": {"alias": "prod", "grade": {"rubric": "r"}}}, "online"),
    ({"own_fields": ["outcome"]}, "own_fields"),
    ({"overridden": ["model"]}, "overridden"),
    ({"constraints": {"max_steps": 5, "tools": ["shell"]}}, "constraints.tools"),
    ({"constraints": {"tool_policies": {"shell": "allow"}}}, "constraints.tool_policies"),
    ({"workspace": {"allow_hosts": ["example.com"]}}, "workspace.allow_hosts"),
    ({"workspace": {"git": {"url": "https://example.com/x.git"}}}, "workspace.git"),
    ({"workspace": {"base": {"manifest": "0" * 64}}}, "workspace.base"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "field"), REFUSED, ids=[f"{f}={json.dumps(c)[:40]}" for c, f in REFUSED])
def test_a_tokens_submission_sets_only_what_its_allow_list_names_anything_else_is_a_403_naming_it(
    api_stack: ApiStack, change: dict[str, Any], field: str
) -> None:
    """Fail-closed: a token runs an agent its tenant defined, as its user, and may set only the
    fields of its own task ``api.user_submission`` lists; every other field of a submission (its
    agent's, its tenant's, a spawn's or an alias's) is 403 ``forbidden`` naming it, ``null``
    included, and nothing is created."""
    api, tenant = api_stack, f"eu-allow-{uuid.uuid4().hex[:6]}"
    greeter = api.greeter(tenant)
    token = api.stack.token(user="mallory", tenant=tenant)
    status, answer, _ = api.http("POST", "/tasks", {**greeter, **change}, key=token)
    assert status == 403, answer
    assert (answer["error"]["code"], answer["error"]["field"]) == ("forbidden", field), answer
    assert _tenant_tasks(api, tenant) == []


def test_a_token_may_set_every_field_of_its_own_task_its_allow_list_names_and_the_task_runs(
    api_stack: ApiStack,
) -> None:
    """What the allow-list keeps a token's: its goal, its own user, budgets and limits (every one
    of ``USER_CONSTRAINTS``), priority, what its messages do, its own tasks as dependencies, its
    labels, and its workspace's starting files and limits. All at once: 202, and the task runs."""
    api, tenant = api_stack, f"eu-own-{uuid.uuid4().hex[:6]}"
    greeter = api.greeter(tenant)
    token = api.stack.token(user="alice", tenant=tenant)
    first = api.submit(greeter, key=token)
    limits = {"max_tokens": 50_000, "max_cost_usd": 1.5, "max_steps": 5, "timeout_seconds": 600,
              "max_output_tokens": 2048, "max_depth": 1, "max_fanout": 2, "approval_timeout_seconds": 60,
              "approval_default": "reject", "context_threshold": 0.5, "keep_tool_results": 3, "economy": False,
              "compaction": "off", "thinking_budget_tokens": 1024, "effort": "low"}  # fmt: skip
    assert set(limits) == USER_CONSTRAINTS
    files = {"files": [{"path": "a.txt", "content_b64": "aGk="}], "max_bytes": 100_000, "max_files": 10}
    body = {**greeter, "user": "alice", "constraints": limits, "priority": "low", "double_texting": "reject",
            "depends_on": [first], "metadata": {"project": "x"}, "workspace": files}  # fmt: skip
    assert set(body) == set(USER_FIELDS)
    task_id = api.submit(body, key=token)
    view = api.until(task_id, lambda v: v["status"] in ("succeeded", "failed", "cancelled"), key=token)
    assert view["status"] == "succeeded" and view["user"] == "alice" and view["metadata"] == {"project": "x"}


def test_every_field_a_token_could_send_is_on_its_allow_list_or_refused_above() -> None:
    """A field added to a submission, its constraints or workspace, or a fork is refused to a
    token until it is listed (the check is an allow-list); this makes whoever adds one decide,
    here, whether a token may set it, and keeps REFUSED (the proof of each refusal) complete."""
    refused = {field for _, field in REFUSED}
    top = {field for field in refused if "." not in field}
    assert set(TaskSubmission.model_fields) == set(USER_FIELDS) | top and set(USER_FIELDS).isdisjoint(top)
    constraints = {f"constraints.{f}" for f in Constraints.model_fields} - refused
    assert constraints == {f"constraints.{f}" for f in USER_CONSTRAINTS}
    workspace = {f"workspace.{f}" for f in WorkspaceSpec.model_fields} - refused
    assert workspace == {f"workspace.{f}" for f in USER_WORKSPACE}
    # A fork's refusals: test_a_tokens_fork_keeps_its_agents_tools_prompt_and_model
    assert set(ForkRequest.model_fields) == {"at_step", *USER_FORK_FIELDS, "provider", "model", "script", "system"}
    assert set(ConstraintsPatch.model_fields) - USER_CONSTRAINTS == {"tools"}
