"""``agentq diff TASK_A TASK_B`` (issue 46, item 4): two tasks side by side, with the first step
where they differ; a fork from step N is the same up to N. On the local stack with the HTTP API,
through the real CLI process."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from tests.api_support import ApiStack
from tests.helpers import call, run_agentq


def _task(second: str, grade: bool = False) -> dict[str, Any]:
    turns = [
        {"text": "look it up", "tool_calls": [call("lookup", query="invoices", size=10)]},
        {"text": second},
    ]
    body: dict[str, Any] = {"goal": "which invoice is largest", "provider": "scripted", "script": {"turns": turns},
                            "constraints": {"tools": ["lookup"]}}  # fmt: skip
    if grade:
        body["outcome"] = {"grader": "says_done", "max_attempts": 1}
    return body


def _diff(api_stack: ApiStack, a: str, b: str, *extra: str) -> Any:
    shown = run_agentq(["diff", a, b, *extra], api_stack.cli_env(), timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    return shown.stdout


def _compare(api_stack: ApiStack, a: str, b: str) -> Any:
    status, body, _ = api_stack.http("GET", f"/tasks/{a}/compare/{b}")
    assert status == 200, body
    return body


def test_two_runs_are_shown_side_by_side_with_the_first_step_that_differs(api_stack: ApiStack) -> None:
    first = api_stack.submit(_task("DONE: invoice 7", grade=True))
    second = api_stack.submit(_task("invoice 7, I think", grade=True))
    same = api_stack.submit(_task("DONE: invoice 7", grade=True))
    for task_id in (first, second, same):
        api_stack.until(task_id, lambda v: v["status"] in ("succeeded", "failed_outcome"))
    compared = json.loads(_diff(api_stack, first, second, "--json"))
    assert compared == _compare(api_stack, first, second)  # the CLI prints the API's comparison
    assert compared["diverged_at"] == 3  # the LLM step, the tools step, then the answers differ
    assert [r["same"] for r in compared["steps"]] == [True, True, False, False]  # the answers, then their grades
    assert (compared["a"]["status"], compared["b"]["status"]) == ("succeeded", "failed_outcome")
    assert (compared["a"]["grade"], compared["b"]["grade"]) == (1.0, 0.2)
    assert compared["a"]["tool_calls"] == compared["b"]["tool_calls"] == 1
    assert compared["delta"]["steps"] == 0
    assert json.loads(_diff(api_stack, first, same, "--json"))["diverged_at"] is None
    text = _diff(api_stack, first, second)
    assert "first difference at step 3" in text and "failed_outcome" in text


def test_a_fork_from_step_n_is_the_same_as_its_original_up_to_n(api_stack: ApiStack) -> None:
    original = api_stack.submit(_task("DONE: invoice 7"))
    api_stack.until(original, lambda v: v["status"] == "succeeded")
    status, forked, _ = api_stack.http("POST", f"/tasks/{original}/fork", {"at_step": 2})
    assert status in (200, 201, 202), forked
    fork = forked["task_id"]
    api_stack.until(fork, lambda v: v["status"] == "succeeded")
    compared = json.loads(_diff(api_stack, original, fork, "--json"))
    assert [r["same"] for r in compared["steps"][:2]] == [True, True]
    assert compared["b"]["forked_from"]["task_id"] == original
    # The scripted model answers the fork's next turn as it answered the original's.
    assert compared["diverged_at"] is None and compared["delta"]["steps"] == 0


def test_only_the_callers_tasks_are_compared_another_tenants_in_either_place_is_not_found(api_stack: ApiStack) -> None:
    mine = api_stack.submit(_task("DONE: invoice 7"))
    theirs = api_stack.submit(_task("DONE: invoice 7"), key=api_stack.other_key)
    for task_id, key in ((mine, "default"), (theirs, api_stack.other_key)):
        api_stack.until(task_id, lambda v: v["status"] == "succeeded", key=key)
    assert _compare(api_stack, mine, mine)["diverged_at"] is None  # the caller's own: compared
    unknown = "no-such-task"
    for a, b, field in ((mine, theirs, "other_id"), (theirs, mine, "task_id"), (mine, unknown, "other_id"),
                        (unknown, mine, "task_id"), (theirs, theirs, "task_id")):  # fmt: skip
        status, body, _ = api_stack.http("GET", f"/tasks/{a}/compare/{b}")
        assert status == 404, (a, b, body)
        assert (body["error"]["code"], body["error"]["field"]) == ("task_not_found", field), body
    # The other tenant sees its own task and not ours, the same way.
    status, body, _ = api_stack.http("GET", f"/tasks/{theirs}/compare/{mine}", key=api_stack.other_key)
    assert status == 404 and body["error"]["field"] == "other_id", body
    shown = run_agentq(["diff", mine, theirs], api_stack.cli_env(), timeout=120)
    assert shown.returncode == 1 and f"no task '{theirs}' (other_id)" in shown.stderr, shown.stderr


def test_a_malformed_id_in_either_place_is_a_422_naming_its_field(api_stack: ApiStack) -> None:
    mine = api_stack.submit(_task("DONE: invoice 7"))
    for bad in ("bad id!", "x" * 129, "a.b"):
        quoted = urllib.parse.quote(bad, safe="")
        for path, field in (
            (f"/tasks/{quoted}/compare/{mine}", "task_id"),
            (f"/tasks/{mine}/compare/{quoted}", "other_id"),
        ):
            status, body, _ = api_stack.http("GET", path)
            assert status == 422, (path, body)
            assert (body["error"]["code"], body["error"]["field"]) == ("validation_error", field), body
