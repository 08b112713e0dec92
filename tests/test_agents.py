"""Agent definitions over real HTTP on the local stack (auth on, two tenants, real workers):
versions are immutable and numbered, a submission that names an agent runs the version it
resolved to (pinned on the task, so later versions change nothing for it), tenants do not see
each other's agents, and every bad definition or reference is a 4xx naming the field."""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentq.runtime import Settings, build_store

from tests.api_support import ApiStack
from tests.helpers import call, run_agentq
from tests.lambda_support import LAMBDA_RESPONSE_BYTES, lambda_pages
from tests.racers import race
from tests.test_api_routes import Api, api

__all__ = ["api"]  # the deployment of tests/test_api_routes.py: the Lambda handler, its own table


def _agent(name: str, text: str, **over: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": "looks things up",
        "provider": "scripted",
        "script": {"turns": [{"text": "looking", "tool_calls": [call("lookup", query="q")]}, {"text": text}]},
        "system": f"You are {name}.",
        "tools": ["lookup", "charge_card"],
        "tool_policies": {"charge_card": "ask"},
        "constraints": {"max_steps": 7, "max_tokens": 50_000},
        **over,
    }


def _name() -> str:
    return f"researcher-{uuid.uuid4().hex[:8]}"


def test_each_changed_definition_is_a_new_immutable_version_and_the_same_one_is_not(api_stack: ApiStack) -> None:
    name = _name()
    status, first, headers = api_stack.http("POST", "/agents", _agent(name, "v1"))
    assert status == 201 and first["created"] and first["agent"]["version"] == 1, first
    assert first["agent"]["ref"] == f"{name}@1" and headers["Location"] == f"/agents/{name}?version=1"
    status, again, _ = api_stack.http("POST", "/agents", _agent(name, "v1"))
    assert status == 200 and not again["created"] and again["agent"]["version"] == 1
    status, second, _ = api_stack.http("POST", "/agents", _agent(name, "v2"))
    assert status == 201 and second["agent"]["version"] == 2

    status, latest, _ = api_stack.http("GET", f"/agents/{name}")
    assert status == 200 and latest["version"] == 2 and latest["script"]["turns"][-1]["text"] == "v2"
    status, one, _ = api_stack.http("GET", f"/agents/{name}?version=1")
    assert (
        status == 200
        and one["script"]["turns"][-1]["text"] == "v1"
        and one["created_at"] == first["agent"]["created_at"]
    )
    status, history, _ = api_stack.http("GET", f"/agents/{name}/versions")
    assert status == 200 and [v["version"] for v in history["versions"]] == [2, 1]
    status, listing, _ = api_stack.http("GET", "/agents")
    [row] = [a for a in listing["agents"] if a["name"] == name]
    assert row["latest_version"] == 2 and row["description"] == "looks things up"


def test_racing_creators_get_distinct_versions_and_none_is_lost(api_stack: ApiStack) -> None:
    name, answers = _name(), []

    def create(i: int) -> None:
        answers.append(api_stack.http("POST", "/agents", _agent(name, f"writer {i}")))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(status for status, _, _ in answers) == [201] * 8, answers
    versions = sorted(body["agent"]["version"] for _, body, _ in answers)
    assert versions == list(range(1, 9))
    _, history, _ = api_stack.http("GET", f"/agents/{name}/versions")
    texts = {v["version"]: v["script"]["turns"][-1]["text"] for v in history["versions"]}
    assert {body["agent"]["version"]: body["agent"]["script"]["turns"][-1]["text"] for _, body, _ in answers} == texts


def test_sixteen_creator_processes_at_one_instant_get_versions_1_to_16_and_none_is_refused(settings: Settings) -> None:
    """16 processes (forked, each its own client, as 16 API Lambdas would be) create a different
    definition of one agent at the same instant: each loses the race for HEAD to every writer
    ahead of it, and each loss is another's version written, so it tries again (after a jittered
    wait) until it has its own; none is refused agent_conflict, and the version each was told it
    got holds its definition."""
    name, n = f"r-{uuid.uuid4().hex[:8]}", 16
    reports = race(settings, "tests.version_racer", [["create", "t", name, str(i)] for i in range(n)])
    assert [r for r in reports if "error" in r] == []
    assert sorted(r["version"] for r in reports) == list(range(1, n + 1))
    store = build_store(settings)
    for r in reports:
        assert r["created"] and store.agents.get("t", name, r["version"]).system == r["system"]


def test_post_agents_that_meets_another_writers_transaction_on_head_tries_again_and_answers_the_version(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DynamoDB cancels a transaction that meets another one on an item (two creators writing an
    agent's HEAD at one moment) with the reason TransactionConflict: nothing written, and a
    separate botocore answer from a failed condition. The version's create tries again on it,
    as on a lost race, where it escaped POST /agents as a 500 internal_error. Moto never answers
    it: DynamoDB's answer is made here, at botocore, three times running."""
    import botocore.client
    from botocore.exceptions import ClientError

    name = f"tc-{uuid.uuid4().hex[:8]}"
    original = botocore.client.BaseClient._make_api_call  # type: ignore[attr-defined]
    left = {"n": 3}

    def busy(client: Any, operation: str, params: dict[str, Any]) -> Any:
        items = [op for item in params.get("TransactItems", []) for op in item.values()]
        heads = [op for op in items if op.get("Item", {}).get("sk") == {"S": "HEAD"} and name in json.dumps(op)]
        if operation == "TransactWriteItems" and heads and left["n"]:
            left["n"] -= 1
            reasons = [{"Code": "TransactionConflict" if op in heads else "None"} for op in items]
            answer: Any = {"Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled, "
                           "please refer cancellation reasons for specific reasons [None, TransactionConflict]"},
                           "CancellationReasons": reasons}  # fmt: skip
            raise ClientError(answer, operation)
        return original(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", busy)
    status, body, _ = api.call("POST", "/agents", {"name": name, "provider": "scripted", "script": "research"})
    assert (status, left["n"]) == (201, 0), body
    assert body["agent"]["version"] == 1 and body["created"]
    assert api.call("GET", f"/agents/{name}")[1]["version"] == 1


def test_a_task_of_an_agent_runs_the_version_it_pinned_even_after_a_new_one(api_stack: ApiStack) -> None:
    name = _name()
    api_stack.http("POST", "/agents", _agent(name, "answer of v1"))
    task_id = api_stack.submit({"goal": "find it", "agent": name, "constraints": {"max_steps": 5}})
    api_stack.http("POST", "/agents", _agent(name, "answer of v2"))  # after the submit: changes nothing for it
    view = api_stack.until(task_id, lambda v: v["status"] == "succeeded")
    assert view["agent"] == f"{name}@1" and view["provider"] == "scripted" and view["max_steps"] == 5
    status, result, _ = api_stack.http("GET", f"/tasks/{task_id}/result")
    assert status == 200 and result["result"] == "answer of v1"

    pinned = api_stack.submit({"goal": "find it", "agent": f"{name}@1"})
    latest = api_stack.submit({"goal": "find it", "agent": name})
    assert api_stack.until(pinned, lambda v: v["status"] == "succeeded")["max_steps"] == 7  # the agent's default
    assert api_stack.until(latest, lambda v: v["agent"] == f"{name}@2" and v["status"] == "succeeded")
    _, result, _ = api_stack.http("GET", f"/tasks/{latest}/result")
    assert result["result"] == "answer of v2"
    task = api_stack.stack.store().tasks.get(latest)
    assert task.submission.system == f"You are {name}." and task.submission.constraints.tools == [
        "lookup",
        "charge_card",
    ]
    assert task.submission.constraints.tool_policies == {"charge_card": "ask"}


def test_a_fork_that_replaces_what_its_agents_version_defines_says_so_beside_its_pin(api: Api) -> None:
    """A fork of a task of ``name@1`` with another system prompt and script keeps ``agent:
    name@1`` (the agent's rules, caps and stops still cover it) but no longer runs version 1
    whole: its submission and view name what it replaced (``overridden``), where the label
    alone claimed it ran 1. A fork changing only budgets replaces nothing; a fork of the fork
    keeps the record; a move to a version takes those fields from it again, and clears it."""
    tenant, name = f"t-{uuid.uuid4().hex[:8]}", _name()
    agent = {"name": name, "provider": "scripted", "system": "You are v1.", "script": {"turns": [{"text": "v1"}]}}
    assert api.call("POST", "/agents", agent, tenant=tenant)[0] == 201
    source = api.submit({"goal": "g", "agent": f"{name}@1"}, tenant=tenant)
    api.run(source)

    def fork(task_id: str, **overrides: Any) -> dict[str, Any]:
        status, view, _ = api.call("POST", f"/tasks/{task_id}/fork", {"at_step": 0, **overrides}, tenant=tenant)
        assert status == 202, view
        return dict(view)

    plain = fork(source, constraints={"max_steps": 3})
    assert (plain["agent"], plain["overridden"]) == (f"{name}@1", [])
    other = fork(source, system="You are someone else.", script={"turns": [{"text": "forked"}]})
    assert (other["agent"], other["overridden"]) == (f"{name}@1", ["script", "system"])
    stored = api.store.tasks.get(other["task_id"]).submission
    assert (stored.agent, stored.overridden) == (f"{name}@1", ["script", "system"])
    assert stored.system == "You are someone else."
    api.run(other["task_id"])
    assert api.call("GET", f"/tasks/{other['task_id']}/result", tenant=tenant)[1]["result"] == "forked"
    again = fork(other["task_id"], provider="anthropic", model="claude-haiku-4-5")
    assert again["overridden"] == ["model", "provider", "script", "system"]
    status, moved, _ = api.call("POST", f"/tasks/{other['task_id']}/agent", {"version": 1}, tenant=tenant)
    assert status == 200, moved
    view = api.call("GET", f"/tasks/{other['task_id']}", tenant=tenant)[1]
    assert (view["agent"], view["overridden"]) == (f"{name}@1", [])
    assert api.store.tasks.get(other["task_id"]).submission.system == "You are v1."


def test_an_agent_is_visible_to_its_tenant_only(api_stack: ApiStack) -> None:
    name = _name()
    api_stack.http("POST", "/agents", _agent(name, "mine"))
    status, body, _ = api_stack.http("GET", f"/agents/{name}", key=api_stack.other_key)
    assert status == 404 and body["error"]["code"] == "agent_not_found"
    _, listing, _ = api_stack.http("GET", "/agents", key=api_stack.other_key)
    assert name not in [a["name"] for a in listing["agents"]]
    status, body, _ = api_stack.http("POST", "/tasks", {"goal": "g", "agent": name}, key=api_stack.other_key)
    assert status == 422 and body["error"]["field"] == "agent"
    # the other tenant's own agent of the same name is its own version 1
    status, theirs, _ = api_stack.http("POST", "/agents", _agent(name, "theirs"), key=api_stack.other_key)
    assert status == 201 and theirs["agent"]["version"] == 1


def test_bad_definitions_and_references_are_refused_naming_the_field(api_stack: ApiStack) -> None:
    name = _name()
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("/agents", {**_agent(name, "x"), "name": "Bad Name"}, 422, "name"),
        ("/agents", _agent(name, "x", tools=["lookup", "no_such_tool"], tool_policies={}), 422, "tools[1]"),
        ("/agents", _agent(name, "x", tool_policies={"wire_money": "ask"}), 422, "tool_policies.wire_money"),
        ("/agents", _agent(name, "x", script="/etc/passwd"), 422, "script"),
        ("/agents", _agent(name, "x", provider="anthropic", script=None, model="gpt-9"), 422, "model"),
        ("/agents", _agent(name, "x", constraints={"max_steps": 0}), 422, "constraints.max_steps"),
        ("/agents", _agent(name, "x", colour="red"), 422, "colour"),
        ("/tasks", {"goal": "g", "agent": "Nope!"}, 422, "agent"),
        ("/tasks", {"goal": "g", "agent": f"{name}-missing"}, 422, "agent"),
    ]
    for path, body, want, field in cases:
        status, answer, _ = api_stack.http("POST", path, body)
        assert (status, answer["error"]["field"]) == (want, field), (body, answer)
    api_stack.http("POST", "/agents", _agent(name, "x"))
    extras: list[tuple[dict[str, Any], str]] = [
        ({"model": "claude-opus-4-1"}, "model"),
        ({"system": "be evil"}, "system"),
        ({"provider": "scripted", "script": "research"}, "provider"),
        ({"constraints": {"tools": ["lookup"]}}, "constraints.tools"),
        ({"constraints": {"tool_policies": {}}}, "constraints.tool_policies"),
    ]
    for extra, field in extras:
        status, answer, _ = api_stack.http("POST", "/tasks", {"goal": "g", "agent": name, **extra})
        assert status == 422 and answer["error"]["field"] == field, (extra, answer)
    status, answer, _ = api_stack.http("POST", "/tasks", {"goal": "g", "agent": f"{name}@9"})
    assert status == 422 and "no version 9" in answer["error"]["message"]
    status, answer, _ = api_stack.http("GET", f"/agents/{name}?version=0")
    assert status == 422
    _, listing, _ = api_stack.http("GET", f"/agents/{name}/versions")
    assert [v["version"] for v in listing["versions"]] == [1]  # nothing half-written by the refusals


def test_the_cli_creates_lists_shows_and_runs_an_agent_from_a_yaml_file(api_stack: ApiStack, tmp_path: Path) -> None:
    name = _name()
    (tmp_path / "script.yaml").write_text(
        "turns:\n  - text: looking\n    tool_calls: [{name: lookup, input: {query: q}}]\n  - text: found it in yaml\n"
    )
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text(
        f"name: {name}\ndescription: a researcher from yaml\nprovider: scripted\nscript: script.yaml\n"
        "system: You research.\ntools: [lookup]\nconstraints: {max_steps: 6}\n"
    )

    def agentq(*args: str) -> subprocess.CompletedProcess[str]:
        return run_agentq(list(args), env=api_stack.cli_env(), timeout=120)

    created = agentq("agents", "create", "-f", str(agent_file))
    assert created.returncode == 0 and created.stdout.strip() == f"{name}@1", created.stderr
    again = agentq("agents", "create", "-f", str(agent_file))
    assert again.stdout.strip() == f"{name}@1" and "unchanged" in again.stderr
    shown = agentq("agents", "show", f"{name}@1")
    assert shown.returncode == 0 and "tools: lookup" in shown.stdout and "max_steps=6" in shown.stdout
    listed = agentq("agents", "list", "--json")
    assert any(a["name"] == name and a["latest_version"] == 1 for a in json.loads(listed.stdout))
    ran = agentq("submit", "--agent", name, "research this", "--wait")
    assert ran.returncode == 0 and ran.stdout.strip() == "found it in yaml", ran.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text(f"name: {name}\ntools: [nope]\n")
    refused = agentq("agents", "create", "-f", str(bad))
    assert refused.returncode == 2 and "tools[0]" in refused.stderr and "Traceback" not in refused.stderr
    missing = agentq("agents", "show", f"{name}-gone")
    assert missing.returncode == 1 and "no agent" in missing.stderr


def test_the_python_client_creates_lists_and_reads_versions(api_stack: ApiStack) -> None:
    from agentq import AgentSpec, Client

    client = Client(api_stack.url, api_stack.key)
    name = _name()
    first = client.create_agent(AgentSpec.model_validate(_agent(name, "one")))
    assert first.created and first.agent.ref == f"{name}@1"
    second = client.create_agent(**_agent(name, "two"))
    assert second.agent.version == 2
    assert client.get_agent(f"{name}@1").script == first.agent.script
    assert client.get_agent(name).version == 2
    assert [v.version for v in client.agent_versions(name)] == [2, 1]
    assert any(a.name == name and a.latest_version == 2 for a in client.list_agents())
    view = client.run({"goal": "find", "agent": f"{name}@1"}, timeout=60)
    assert view.agent == f"{name}@1" and view.status.value == "succeeded"


def test_an_agents_constraint_defaults_have_the_bounds_of_a_tasks_constraints() -> None:
    """A default the task would refuse must be refused when the version is created, not on
    every submission of it: each field is bounded exactly as ``Constraints`` bounds it."""
    from agentq.core.agents import AgentConstraints
    from agentq.core.models import Constraints

    for name, field in AgentConstraints.model_fields.items():
        task_field = Constraints.model_fields[name]
        assert field.metadata == task_field.metadata, name
        assert field.default is None  # unset: the task's own default or the deployment's applies


def test_an_agent_s_versions_are_listed_in_pages_each_within_one_lambda_answer(api: Api) -> None:
    """32 versions of a 200 KB definition were 6.4 MB in one answer: past the 6 MB a Lambda may
    answer (API Gateway's 502, and no cursor to read less). Pages stop at ?limit= or 2 MB, and
    following next_cursor lists each version once, newest first."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    for i in range(32):
        spec = {"name": "big", "provider": "scripted", "script": {"turns": [{"text": f"{i}" + "x" * 200_000}]}}
        assert api.call("POST", "/agents", spec, tenant=tenant)[0] == 201
    versions, sizes = lambda_pages(api, "/agents/big/versions", "versions", tenant)
    assert [v["version"] for v in versions] == list(range(32, 0, -1))
    assert len(sizes) > 1 and max(sizes) < LAMBDA_RESPONSE_BYTES / 2, sizes
    versions, sizes = lambda_pages(api, "/agents/big/versions?limit=5", "versions", tenant)
    assert [v["version"] for v in versions] == list(range(32, 0, -1)) and len(sizes) == 7


def test_an_agent_s_versions_refuse_a_bad_limit_and_a_cursor_of_another_listing(api: Api) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    for name in ("one", "two"):
        for text in ("a", "b"):
            spec = {"name": name, "provider": "scripted", "script": {"turns": [{"text": text}]}}
            assert api.call("POST", "/agents", spec, tenant=tenant)[0] == 201
    for limit in (0, 101, "x"):
        status, body, _ = api.call("GET", f"/agents/one/versions?limit={limit}", tenant=tenant)
        assert (status, body["error"]["field"]) == (422, "limit"), body
    status, first, _ = api.call("GET", "/agents/one/versions?limit=1", tenant=tenant)
    assert status == 200 and [v["version"] for v in first["versions"]] == [2] and first["next_cursor"]
    status, rest, _ = api.call("GET", f"/agents/one/versions?limit=1&cursor={first['next_cursor']}", tenant=tenant)
    assert (status, [v["version"] for v in rest["versions"]], rest["next_cursor"]) == (200, [1], None)
    from agentq.api.cursors import encode_cursor

    for cursor in (first["next_cursor"], encode_cursor("memory_stores", "one"), "not-a-cursor!", "e30"):
        url = f"/agents/two/versions?cursor={cursor}"  # another agent's cursor, another listing's, forged
        status, body, _ = api.call("GET", url, tenant=tenant)
        assert (status, body["error"]["code"], body["error"]["field"]) == (400, "invalid_cursor", "cursor"), body
