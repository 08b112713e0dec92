"""Policy rules over real HTTP on the local stack (auth on, two tenants, real worker processes):
a call a rule denies never runs (the side-effecting tool's ledger, written by the worker process,
has no line of it) and the model reads the rule's message, ``ask`` pauses the task until a person
approves and the call then runs once, ``log_only`` changes nothing but is recorded beside what
happened, a rule that fails at evaluation denies, a denied model call ends the task naming the
rule (the grading model's call of an outcome too, the answer kept), every bad document is a 422
naming the field with nothing stored, and one tenant's rules
never touch another tenant's tasks.

The stack's workers read the rules at every check (``AGENTQ_POLICY_CACHE_SECONDS=0`` in
tests/conftest.py), and every rule here is scoped to an agent of the test's own, so the tests
sharing the stack never meet them."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

from tests.api_support import ApiStack
from tests.helpers import call, run_agentq
from tests.lambda_support import LAMBDA_RESPONSE_BYTES, lambda_pages
from tests.test_api_routes import Api, api

__all__ = ["api"]  # the deployment of tests/test_api_routes.py: the Lambda handler, its own table


def _agent(api: ApiStack, turns: list[dict[str, Any]], key: str | None = "default") -> str:
    name = f"pol-{uuid.uuid4().hex[:10]}"
    body = {"name": name, "provider": "scripted", "script": {"turns": turns}, "tools": ["lookup", "charge_card"]}
    status, data, _ = api.http("POST", "/agents", body, key=key)
    assert status == 201, data
    return name


def _charge_turns(*amounts: int) -> list[dict[str, Any]]:
    return [
        {"text": f"charging {a}", "tool_calls": [call("charge_card", amount_cents=a, memo="m")]} for a in amounts
    ] + [{"text": "done"}]


def _put(api: ApiStack, scope: str, text: str, key: str | None = "default") -> tuple[int, dict[str, Any]]:
    status, data, _ = api.http("PUT", f"/policies/{scope}", {"policies": text}, key=key)
    return status, data


def _amounts() -> tuple[int, int]:
    base = random.randrange(10_000_000, 90_000_000)
    return base + 1, base + 2  # unique to this test: the ledger is the stack's


def _run(api: ApiStack, agent: str, key: str | None = "default") -> tuple[str, dict[str, Any]]:
    task_id = api.submit({"goal": "charge", "agent": agent}, key=key)
    view = api.until(task_id, lambda v: v["status"] in ("succeeded", "failed", "paused"), key=key)
    return task_id, view


def _trace_text(api: ApiStack, task_id: str, key: str | None = "default") -> str:
    status, trace, _ = api.http("GET", f"/tasks/{task_id}/trace", key=key)
    assert status == 200, trace
    return json.dumps(trace)


def test_a_call_a_rule_denies_never_runs_and_the_model_reads_the_rules_message(api_stack: ApiStack) -> None:
    small, big = _amounts()
    agent = _agent(api_stack, _charge_turns(big, small))
    status, data = _put(
        api_stack,
        f"agent:{agent}",
        f"""
        @id("no-big-charges") @message("charges above {small} cents are not allowed")
        forbid(principal, action == Action::"tool", resource == Tool::"charge_card")
        when {{ context.args has amount_cents && context.args.amount_cents > {small} }};""",
    )
    assert status == 201 and data["policy"]["version"] == 1 and data["warnings"] == [], data
    task_id, view = _run(api_stack, agent)
    assert view["status"] == "succeeded", view
    assert _ledger_count(api_stack, big) == 0  # the denied call never ran, in the worker process
    assert _ledger_count(api_stack, small) == 1  # the allowed one of the same task did
    trace = _trace_text(api_stack, task_id)
    assert f"charges above {small} cents are not allowed" in trace and "agent:" + agent + "/no-big-charges" in trace


def test_ask_pauses_before_the_call_and_it_runs_once_when_approved(api_stack: ApiStack) -> None:
    small, big = _amounts()
    agent = _agent(api_stack, _charge_turns(big))
    _put(
        api_stack,
        f"agent:{agent}",
        f"""
        @id("approve-big") @effect("ask") @message("a person approves charges above {small}")
        forbid(principal, action == Action::"tool", resource == Tool::"charge_card")
        when {{ context.args has amount_cents && context.args.amount_cents > {small} }};""",
    )
    task_id, view = _run(api_stack, agent)
    assert view["status"] == "paused", view
    assert _ledger_count(api_stack, big) == 0  # nothing ran before the decision
    _status, data, _ = api_stack.http("GET", f"/tasks/{task_id}")
    assert "approve-big" in json.dumps(data), data  # the question names the rule
    assert api_stack.http("POST", f"/tasks/{task_id}/approve", {"note": "fine"})[0] == 200
    view = api_stack.until(task_id, lambda v: v["status"] in ("succeeded", "failed"))
    assert view["status"] == "succeeded" and _ledger_count(api_stack, big) == 1


def test_log_only_changes_nothing_but_what_it_would_have_decided_is_recorded(api_stack: ApiStack) -> None:
    small, _ = _amounts()
    agent = _agent(api_stack, _charge_turns(small))
    _put(
        api_stack,
        f"agent:{agent}",
        """
        @id("shadow-all-charges") @mode("log_only") @message("would stop every charge")
        forbid(principal, action == Action::"tool", resource == Tool::"charge_card");""",
    )
    task_id, view = _run(api_stack, agent)
    assert view["status"] == "succeeded" and _ledger_count(api_stack, small) == 1
    trace = _trace_text(api_stack, task_id)
    assert '"log_only"' in trace and "shadow-all-charges" in trace and '"decision": "allow"' in trace


def test_a_rule_that_fails_at_evaluation_denies(api_stack: ApiStack) -> None:
    small, _ = _amounts()
    agent = _agent(api_stack, _charge_turns(small))
    # Validates (the argument is read behind `has`), fails on the call: memo is a string.
    status, data = _put(
        api_stack,
        f"agent:{agent}",
        """
        @id("broken") forbid(principal, action == Action::"tool", resource)
        when { context.args has memo && context.args.memo > 5 };""",
    )
    assert status == 201, data
    task_id, view = _run(api_stack, agent)
    assert view["status"] == "succeeded" and _ledger_count(api_stack, small) == 0
    trace = _trace_text(api_stack, task_id)
    assert "broken" in trace and "failed to evaluate" in trace


def test_a_model_call_a_rule_denies_is_never_made_and_the_task_fails_naming_the_rule(api_stack: ApiStack) -> None:
    small, _ = _amounts()
    agent = _agent(api_stack, _charge_turns(small))
    _put(
        api_stack,
        f"agent:{agent}",
        """
        @id("no-models") @message("this agent is switched off")
        forbid(principal, action == Action::"model", resource);""",
    )
    _task_id, view = _run(api_stack, agent)
    assert view["status"] == "failed" and view["error"]["code"] == "policy_denied", view
    assert "no-models" in view["error"]["message"] and view["step"] == 0
    assert _ledger_count(api_stack, small) == 0


def test_a_rule_over_the_grading_model_stops_the_grade_and_the_task_fails_naming_it_with_the_answer_kept(
    api_stack: ApiStack,
) -> None:
    """The grading model's call of an outcome's rubric is a model call like the agent's: checked
    in the worker process before it is held or sent (tests/test_outcomes_policies.py: every way)."""
    name, judge = f"pol-{uuid.uuid4().hex[:10]}", f"judge-{uuid.uuid4().hex[:8]}"
    grade = {"rubric": "names a colour", "model": judge, "script": {"turns": [{"text": '{"score": 1}'}]}}
    body = {"name": name, "provider": "scripted", "script": {"turns": [{"text": "Blue."}]}, "outcome": grade}
    status, data, _ = api_stack.http("POST", "/agents", body)
    assert status == 201, data
    _put(
        api_stack,
        f"agent:{name}",
        f"""
        @id("no-judge") @message("grades are switched off")
        forbid(principal, action == Action::"model", resource == Model::"{judge}");""",
    )
    _task_id, view = _run(api_stack, name)
    assert view["status"] == "failed" and view["error"]["code"] == "policy_denied", view
    assert view["error"]["message"].startswith("grading model call denied by policy rule"), view["error"]
    assert f"agent:{name}/no-judge" in view["error"]["message"]
    assert view["result"] == "Blue." and view["step"] == 1 and view["grade"] is None, view  # answered, never graded


def test_a_broken_document_is_a_422_naming_the_field_and_nothing_is_stored(api_stack: ApiStack) -> None:
    scope = f"agent:pol-bad-{uuid.uuid4().hex[:8]}"
    bad = {
        "does not parse": "forbid(principal, action, resource) when {",
        "no @id": "forbid(principal, action, resource);",
        "has no @id": '@message("x") forbid(principal, action, resource);',
        "is a permit": '@id("p") permit(principal, action, resource);',
        "history.nope": '@id("a") forbid(principal, action, resource) when { context.history.nope > 1 };',
        "optional attribute `user`": '@id("a") forbid(principal, action, resource) when { context.user == "x" };',
        "unknown annotation": '@id("a") @mood("log_only") forbid(principal, action, resource);',
        '@mode is "enforce"': '@id("a") @mode("shadow") forbid(principal, action, resource);',
        "two rules": '@id("a") forbid(principal, action, resource); @id("a") forbid(principal, action, resource);',
        "expected Long": '@id("a") forbid(principal, action, resource) when { context.history.tool_calls > "x" };',
    }
    for why, text in bad.items():
        status, data = _put(api_stack, scope, text)
        assert status == 422 and data["error"]["field"] == "policies", (why, data)
        if why != "no @id":
            assert why in data["error"]["message"], (why, data)
    assert api_stack.http("GET", f"/policies/{scope}")[0] == 404  # nothing stored
    status, data = _put(api_stack, "agent:Not_A_Name", '@id("a") forbid(principal, action, resource);')
    assert status == 422 and data["error"]["field"] == "scope", data
    status, data, _ = api_stack.http("PUT", f"/policies/{scope}", {"policies": 5})
    assert status == 422 and data["error"]["field"] == "policies", data


def test_a_rule_denying_everything_is_stored_with_a_warning_and_versions_are_kept(api_stack: ApiStack) -> None:
    scope = f"agent:pol-all-{uuid.uuid4().hex[:8]}"
    status, data = _put(api_stack, scope, '@id("stop") forbid(principal, action, resource);')
    assert status == 201 and len(data["warnings"]) == 1 and "stop" in data["warnings"][0], data
    assert _put(api_stack, scope, '@id("stop") forbid(principal, action, resource);')[0] == 200  # same: no version
    assert _put(api_stack, scope, "")[0] == 201  # emptied: a version too
    status, history, _ = api_stack.http("GET", f"/policies/{scope}/history")
    assert status == 200 and [d["version"] for d in history["policies"]] == [2, 1]
    writer = _key_id(api_stack, api_stack.key)  # each version records the key that wrote it
    assert data["policy"]["created_by"] == writer and [d["created_by"] for d in history["policies"]] == [writer] * 2
    assert api_stack.http("GET", f"/policies/{scope}?version=1")[1]["policies"].startswith('@id("stop")')


def test_one_tenants_rules_never_touch_another_tenants_tasks(api_stack: ApiStack) -> None:
    small, _ = _amounts()
    agent = _agent(api_stack, _charge_turns(small))
    other = api_stack.other_key
    # team-b names the same scope and forbids everything in it; team-a's agent of that name runs on.
    status, data = _put(api_stack, f"agent:{agent}", '@id("b-stop") forbid(principal, action, resource);', key=other)
    assert status == 201, data
    task_id, view = _run(api_stack, agent)
    assert view["status"] == "succeeded" and _ledger_count(api_stack, small) == 1
    assert "b-stop" not in _trace_text(api_stack, task_id)
    assert api_stack.http("GET", f"/policies/agent:{agent}")[0] == 404  # team-a does not see team-b's
    assert all(d["scope"] != f"agent:{agent}" for d in api_stack.http("GET", "/policies")[1]["policies"])
    decided = api_stack.http("POST", "/policies/test", {"principal": {"agent": agent}, "call": {"tool": "lookup"}})[1]
    assert decided["decision"] == "allow", decided  # team-a's test sees its own rules only
    decided = api_stack.http(
        "POST", "/policies/test", {"principal": {"agent": agent}, "call": {"tool": "lookup"}}, key=other
    )[1]
    assert decided["decision"] == "deny" and decided["rule"] == f"agent:{agent}/b-stop", decided


def test_policy_test_decides_a_sample_call_without_running_anything(api_stack: ApiStack) -> None:
    rules = """
        @id("refund-after-fraud-check") @message("refunds only after fraud_check returned ok in this task")
        forbid(principal, action == Action::"tool", resource == Tool::"refund")
        unless { context.history.ok_tools.contains("fraud_check") };
        @id("approve-big") @effect("ask")
        forbid(principal, action == Action::"tool", resource)
        when { context.args has amount && context.args.amount > 100 };"""
    cases = [
        ([], {"amount": 5}, "deny", "refund-after-fraud-check"),
        ([{"name": "fraud_check", "status": "error"}], {"amount": 5}, "deny", "refund-after-fraud-check"),
        ([{"name": "fraud_check", "status": "ok"}], {"amount": 5}, "allow", None),
        ([{"name": "fraud_check", "status": "ok"}], {"amount": 101}, "ask", "approve-big"),
        ([{"name": "fraud_check", "status": "ok"}], {"amount": 100}, "allow", None),
        ([{"name": "fraud_check", "status": "ok"}], {"amount": 100.5}, "deny", "approve-big"),  # fails: denies
    ]
    for tools, args, decision, rule in cases:
        body = {"policies": {"tenant": rules}, "call": {"tool": "refund", "args": args}, "history": {"tools": tools}}
        status, data, _ = api_stack.http("POST", "/policies/test", body)
        assert status == 200 and data["decision"] == decision, (tools, args, data)
        assert (data.get("rule") or None) == (f"tenant/{rule}" if rule else None), data
    assert api_stack.http("GET", "/policies/tenant")[0] == 404  # the tested text was not stored


def test_the_cli_puts_lists_tests_and_shows_history(api_stack: ApiStack, tmp_path: Any) -> None:
    scope = f"agent:pol-cli-{uuid.uuid4().hex[:8]}"
    rules = tmp_path / "rules.cedar"
    rules.write_text('@id("no-fetch") forbid(principal, action == Action::"tool", resource == Tool::"http_fetch");')
    env = api_stack.cli_env()
    put = run_agentq(["policy", "put", scope, str(rules)], env, 60)
    assert put.returncode == 0 and "version 1" in put.stdout, put
    listed = run_agentq(["policy", "list"], env, 60)
    assert listed.returncode == 0 and scope in listed.stdout, listed
    agent = scope.split(":", 1)[1]
    tested = run_agentq(["policy", "test", "--agent", agent, "--tool", "http_fetch"], env, 60)
    assert tested.returncode == 0 and "deny" in tested.stdout and "no-fetch" in tested.stdout, tested
    tested = run_agentq(["policy", "test", "--agent", agent, "--tool", "lookup"], env, 60)
    assert tested.returncode == 0 and "allow" in tested.stdout, tested
    history = run_agentq(["policy", "history", scope], env, 60)
    assert history.returncode == 0 and "v1" in history.stdout, history
    assert history.stdout.rstrip().endswith(f"by {_key_id(api_stack, api_stack.key)}"), history.stdout  # who wrote it
    rules.write_text("forbid(principal, action, resource) when {")
    bad = run_agentq(["policy", "put", scope, str(rules)], env, 60)
    assert bad.returncode != 0 and "policies" in bad.stderr + bad.stdout, bad


def _ledger_count(api: ApiStack, amount: int) -> int:
    """Executions of charge_card with ``amount`` by the stack's worker processes (their ledger)."""
    file = Path(api.stack.extra_env["AGENTQ_TEST_LEDGER"])
    lines = file.read_text().splitlines() if file.exists() else []
    return sum(1 for line in lines if json.loads(line).get("amount") == amount)  # graders log there too


def _key_id(api: ApiStack, key: str) -> str:
    found = api.stack.keys().lookup(key)
    assert found is not None
    return found.key_id


def test_a_scope_s_history_is_listed_in_pages_each_within_one_lambda_answer(api: Api) -> None:
    """100 versions of 64,000-character rules were 6.4 MB in one answer: past the 6 MB a Lambda
    may answer (API Gateway's 502, and no cursor to read less). Pages stop at ?limit= or 2 MB,
    and following next_cursor lists each version once, newest first."""
    import uuid

    from agentq.api.cursors import encode_cursor

    tenant = f"t-{uuid.uuid4().hex[:8]}"
    for i in range(100):
        text = f"// {i} " + "c" * 63_800 + f'\n@id("r{i}")\nforbid(principal, action == Action::"tool", resource);'
        assert api.call("PUT", "/policies/tenant", {"policies": text}, tenant=tenant)[0] == 201
    listed, sizes = lambda_pages(api, "/policies/tenant/history", "policies", tenant)
    assert [d["version"] for d in listed] == list(range(100, 0, -1))
    assert len(sizes) > 1 and max(sizes) < LAMBDA_RESPONSE_BYTES / 2, sizes
    listed, sizes = lambda_pages(api, "/policies/tenant/history?limit=30", "policies", tenant)
    assert [d["version"] for d in listed] == list(range(100, 0, -1)) and len(sizes) == 4
    for limit in (0, 101, "x"):
        status, body, _ = api.call("GET", f"/policies/tenant/history?limit={limit}", tenant=tenant)
        assert (status, body["error"]["field"]) == (422, "limit"), body
    for cursor in (encode_cursor("policy_history", ["agent:a", 5]), encode_cursor("policy_history", ["tenant", 0]),
                   encode_cursor("agent_versions", ["tenant", 5]), "e30", "no!"):  # fmt: skip
        status, body, _ = api.call("GET", f"/policies/tenant/history?cursor={cursor}", tenant=tenant)
        assert (status, body["error"]["code"], body["error"]["field"]) == (400, "invalid_cursor", "cursor"), body
