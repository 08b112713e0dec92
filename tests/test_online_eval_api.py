"""Online evaluation over real HTTP on the local stack (auth on, real worker processes) and
through the CLI: an alias set with ``online`` grades the tasks it samples, and ``GET
/agents/{name}/quality`` (``agentq agents quality``) shows each version's pass rate and cost per
hour, a sampled task that ended without an answer counted apart (``unanswered``); every bad
rate or grade is a 422 naming the field with nothing stored; a submission cannot send the sampled
grade itself."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from tests.api_support import ApiStack
from tests.helpers import run_agentq


def _name() -> str:
    return f"online-{uuid.uuid4().hex[:8]}"


def _agent(name: str, answer: str) -> dict[str, Any]:
    return {"name": name, "provider": "scripted", "script": {"turns": [{"text": answer}]}, "system": "s"}


def _quality(api_stack: ApiStack, name: str, graded: int) -> dict[str, Any]:
    """The quality report once ``graded`` answers were counted (the workers grade in the background)."""
    deadline = time.monotonic() + 90
    while True:
        status, body, _ = api_stack.http("GET", f"/agents/{name}/quality?hours=2")
        assert status == 200, body
        if sum(b["graded"] for b in body["buckets"]) >= graded or time.monotonic() > deadline:
            return dict(body)
        time.sleep(0.2)


def test_bad_online_evaluations_are_refused_naming_the_field_and_store_nothing(api_stack: ApiStack) -> None:
    name = _name()
    assert api_stack.http("POST", "/agents", _agent(name, "DONE"))[0] == 201
    path = f"/agents/{name}/aliases/prod"
    one = [{"version": 1, "weight": 100}]
    cases: list[tuple[Any, str]] = [
        ({"rate": 1.5, "grade": {"grader": "says_done"}}, "online.rate"),
        ({"rate": -0.1, "grade": {"grader": "says_done"}}, "online.rate"),
        ({"rate": "half", "grade": {"grader": "says_done"}}, "online.rate"),
        ({"rate": True, "grade": {"grader": "says_done"}}, "online.rate"),
        ({"grade": {"grader": "says_done"}}, "online.rate"),
        ({"rate": 0.5, "grade": {}}, "online.grade.rubric"),
        ({"rate": 0.5}, "online.grade"),
        ({"rate": 0.5, "grade": {"grader": "no_such_grader"}}, "online.grade.grader"),
        ({"rate": 0.5, "grade": {"rubric": "r"}}, "online.grade.script"),  # the version's scripted model
        ({"rate": 0.5, "grade": {"grader": "says_done", "max_attempts": 3}}, "online.grade.max_attempts"),
        ({"rate": 0.5, "grade": {"grader": "says_done", "bar": 2}}, "online.grade.bar"),
        ({"rate": 0.5, "grade": {"grader": "says_done"}, "colour": "red"}, "online.colour"),
        ("often", "online"),
    ]
    for online, field in cases:
        status, answer, _ = api_stack.http("PUT", path, {"versions": one, "online": online})
        assert (status, answer["error"]["field"]) == (422, field), (online, answer)
    status, listing, _ = api_stack.http("GET", f"/agents/{name}/aliases")
    assert status == 200 and listing == {"agent": name, "aliases": []}  # nothing stored by any refusal

    graded = {"alias": "prod", "grade": {"grader": "says_done"}}
    status, answer, _ = api_stack.http("POST", "/tasks", {"goal": "g", "agent": f"{name}@1", "online": graded})
    assert (status, answer["error"]["field"]) == (422, "online"), answer
    # a client that sends every field of a submission sends online as null: that is no claim to be sampled
    status, answer, _ = api_stack.http("POST", "/tasks", {"goal": "g", "agent": f"{name}@1", "online": None})
    assert status == 202, answer


def test_sampled_tasks_are_graded_per_version_and_the_quality_read_shows_pass_rate_and_cost(
    api_stack: ApiStack,
) -> None:
    name = _name()
    for answer in ("DONE", "not yet"):
        assert api_stack.http("POST", "/agents", _agent(name, answer))[0] == 201
    body = {"versions": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}],
            "online": {"rate": 1, "grade": {"grader": "says_done"}}}  # fmt: skip
    status, alias, _ = api_stack.http("PUT", f"/agents/{name}/aliases/prod", body)
    assert status == 200 and alias["online"]["rate"] == 1, alias
    ran: dict[int, int] = {1: 0, 2: 0}
    for _ in range(8):
        task_id = api_stack.submit({"goal": "g", "agent": f"{name}@prod"})
        view = api_stack.until(task_id, lambda v: v["status"] == "succeeded", timeout=90)
        assert view["grade"]["online"] == "prod", view  # graded, not gated: succeeded whatever the grade
        ran[int(view["agent"].split("@")[1])] += 1
    report = _quality(api_stack, name, 8)
    counted = {b["version"]: (b["graded"], b["passed"], b["pass_rate"]) for b in report["buckets"]}
    assert counted == {v: (n, n if v == 1 else 0, 1.0 if v == 1 else 0.0) for v, n in ran.items() if n}, report

    # A fork of a sampled task is a what-if, not live traffic: it runs ungraded and counts nowhere.
    status, forked, _ = api_stack.http("POST", f"/tasks/{task_id}/fork", {"at_step": 0})
    assert status in (200, 201, 202), forked
    fork_view = api_stack.until(forked["task_id"], lambda v: v["status"] == "succeeded", timeout=90)
    assert fork_view["grade"] is None, fork_view
    # (a grade is counted before the commit that ends its task: had the fork been graded, it would show now)
    assert sum(b["graded"] for b in api_stack.http("GET", f"/agents/{name}/quality?hours=2")[1]["buckets"]) == 8

    shown = run_agentq(["agents", "quality", name, "--hours", "2"], env=api_stack.cli_env(), timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "pass rate" in shown.stdout and ("100%" in shown.stdout or "0%" in shown.stdout), shown.stdout
    as_json = run_agentq(["agents", "quality", name, "--json"], env=api_stack.cli_env(), timeout=120)
    assert sum(b["graded"] for b in json.loads(as_json.stdout)["buckets"]) == 8
    status, answer, _ = api_stack.http("GET", f"/agents/{name}/quality?hours=0")
    assert (status, answer["error"]["field"]) == (422, "hours"), answer


def test_a_sampled_task_that_ends_without_an_answer_shows_as_unanswered_and_a_fail_of_its_versions_pass_rate(
    api_stack: ApiStack,
) -> None:
    """A canary that loops until it runs out of steps never answers: its quality must say so
    (unanswered, a pass rate of 0), in the API and the CLI, not show nothing at all."""
    name = _name()
    looping = {"text": "", "tool_calls": [{"name": "lookup", "input": {"query": "q"}}]}
    agent = {"name": name, "provider": "scripted", "system": "s", "tools": ["lookup"], "constraints": {"max_steps": 2},
             "script": {"turns": [looping] * 5}}  # fmt: skip
    assert api_stack.http("POST", "/agents", agent)[0] == 201, agent
    alias = {"versions": [{"version": 1, "weight": 100}], "online": {"rate": 1, "grade": {"grader": "says_done"}}}
    assert api_stack.http("PUT", f"/agents/{name}/aliases/prod", alias)[0] == 200
    task_id = api_stack.submit({"goal": "g", "agent": f"{name}@prod"})
    view = api_stack.until(task_id, lambda v: v["status"] == "cost_exceeded", timeout=90)
    assert view["grade"] is None, view  # never answered, never graded
    deadline = time.monotonic() + 90  # the worker counts it as it reports the end, after the status is written
    while not (report := api_stack.http("GET", f"/agents/{name}/quality?hours=2")[1])["buckets"]:
        assert time.monotonic() < deadline, report
        time.sleep(0.2)
    (bucket,) = report["buckets"]
    assert (bucket["version"], bucket["graded"], bucket["unanswered"], bucket["pass_rate"]) == (1, 0, 1, 0.0), report
    assert float(bucket["task_cost_usd"]) > 0, report
    shown = run_agentq(["agents", "quality", name, "--hours", "2"], env=api_stack.cli_env(), timeout=120)
    assert shown.returncode == 0, shown.stderr
    header, row = shown.stdout.splitlines()[:2]
    assert "unanswered" in header.split() and row.split()[2:7] == ["v1", "0", "0", "0", "1"], shown.stdout
    assert row.split()[7] == "0%", shown.stdout


def test_the_cli_sets_a_sample_rate_and_refuses_a_bad_one_naming_the_field(api_stack: ApiStack) -> None:
    name = _name()
    api_stack.http("POST", "/agents", _agent(name, "DONE"))

    def agentq(*args: str) -> Any:
        return run_agentq(["agents", "alias", *args], env=api_stack.cli_env(), timeout=120)

    made = agentq("set", name, "prod", "1", "--sample", "0.25", "--grader", "says_done")
    assert made.returncode == 0 and "grading 25% online" in made.stdout, made.stderr
    shown = json.loads(agentq("show", name, "prod", "--json").stdout)
    assert shown["online"]["rate"] == 0.25 and shown["online"]["grade"]["grader"] == "says_done"
    for bad, field in ((["--sample", "1.5", "--grader", "says_done"], "online.rate"),
                       (["--sample", "0.5"], "online.grade.rubric"),
                       (["--sample", "lots", "--grader", "says_done"], "--sample"),
                       (["--grader", "says_done"], "--sample")):  # fmt: skip
        refused = agentq("set", name, "prod", "1", *bad)
        assert refused.returncode == 2 and field in refused.stderr and "Traceback" not in refused.stderr, (
            bad, refused.stderr)  # fmt: skip
    unchanged = json.loads(agentq("show", name, "prod", "--json").stdout)
    assert unchanged["revision"] == 1 and unchanged["online"]["rate"] == 0.25
    off = agentq("set", name, "prod", "1")  # setting it without --sample turns online evaluation off
    assert off.returncode == 0 and "grading" not in off.stdout
    assert json.loads(agentq("show", name, "prod", "--json").stdout).get("online") is None


def test_the_quality_and_aliases_of_an_agent_the_tenant_does_not_have_are_404_agent_not_found(
    api_stack: ApiStack,
) -> None:
    """As its definition and versions are: they answered 200 with nothing in them, as if the
    agent existed and was never graded (a misspelt name read as "no grades yet"), though the
    routes list 404. Another tenant's agent of that name is not found either."""
    name = _name()
    assert api_stack.http("POST", "/agents", _agent(name, "DONE"))[0] == 201
    for path in (f"/agents/{name}/quality", f"/agents/{name}/aliases"):
        assert api_stack.http("GET", path)[0] == 200, path  # its own agent, never graded: empty
        for missing, key in ((f"{name}-nope", "default"), (name, api_stack.other_key)):
            status, answer, _ = api_stack.http("GET", path.replace(name, missing), key=key)
            assert (status, answer["error"]["code"]) == (404, "agent_not_found"), (path, missing, answer)
    shown = run_agentq(["agents", "quality", f"{name}-nope"], env=api_stack.cli_env(), timeout=120)
    assert shown.returncode == 1 and "no agent" in shown.stderr, shown.stderr
