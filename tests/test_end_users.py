"""End users (``core.endusers``): a submission may name the user a task acts for; the task and its
whole tree carry it (META, the task view, the listing, the trace, every event), a sub-agent cannot
name another, and a name outside the documented charset is a 422 naming ``user`` that stores
nothing. Over HTTP on the local stack, with its real workers."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentq.core.models import TaskSubmission

from tests.api_support import ApiStack
from tests.helpers import call

# The charset as docs/API.md states it, written here independently of the code under test.
DOCUMENTED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+:|-]*")
NEAR = "aZ09._@+:|-#/=, \t\n\x00é$%&*()[]{}<>?!'\"\\~`^;"


def _documented(value: str) -> bool:
    return 1 <= len(value) <= 128 and DOCUMENTED.fullmatch(value) is not None


@settings(max_examples=600, deadline=None)
@given(
    st.one_of(
        st.text(alphabet=NEAR, max_size=8),
        st.text(max_size=140),
        st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._@+:|-]{0,135}\Z"),
    )
)
def test_a_user_is_accepted_exactly_when_it_is_in_the_documented_charset(value: str) -> None:
    try:
        sub = TaskSubmission(goal="g", script="hello", user=value)
    except ValidationError as exc:
        assert not _documented(value), f"{value!r} refused: {exc}"
        assert [e["loc"] for e in exc.errors()] == [("user",)]
    else:
        assert _documented(value), f"{value!r} accepted"
        assert sub.user == value


def _leaf(name: str) -> dict[str, Any]:
    return {"goal": name, "tools": ["lookup"], "script": {"turns": [{"text": f"{name} done"}]}}


def _spawning(goal: str, children: list[dict[str, Any]]) -> dict[str, Any]:
    turns = [{"text": "", "tool_calls": [call("spawn_subagents", subagents=children)]}, {"text": f"{goal} done"}]
    return {"goal": goal, "tools": ["spawn_subagents", "lookup"], "script": {"turns": turns}}


def _root(spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"goal": spec["goal"], "provider": "scripted", "script": spec["script"],
            "constraints": {"tools": spec["tools"]}, **extra}  # fmt: skip


def _tree(api: ApiStack, task_id: str, key: str) -> list[dict[str, Any]]:
    """The views of a task and of every task under it."""
    status, view, _ = api.http("GET", f"/tasks/{task_id}", key=key)
    assert status == 200, view
    return [view, *(v for child in view["children"]["task_ids"] for v in _tree(api, child, key))]


def _events(api: ApiStack, task_id: str, key: str) -> list[dict[str, Any]]:
    req = urllib.request.Request(
        f"{api.url}/tasks/{task_id}/events?tree=true", headers={"Authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return list(json.loads(resp.read())["events"])


BAD_USERS: list[Any] = ["", "x" * 129, "a b", "bob\n", "#bob", "a/b", "a=b", "a,b", "-bob", ".bob", "zoë", 42, True,
                        ["bob"], {"id": "bob"}]  # fmt: skip


@pytest.mark.parametrize("bad", BAD_USERS, ids=repr)
def test_a_bad_user_is_a_422_naming_user_and_stores_nothing(api_stack: ApiStack, bad: Any) -> None:
    key = api_stack.stack.create_api_key("eu-bad-user", act_for_users=True)
    status, body, _ = api_stack.http("POST", "/tasks", _root(_leaf("x"), user=bad), key=key)
    assert status == 422 and body["error"]["field"] == "user", body
    status, page, _ = api_stack.http("GET", "/tasks?include_children=true", key=key)
    assert status == 200 and page["tasks"] == []


def test_a_tree_acts_for_its_roots_user_at_every_depth(api_stack: ApiStack) -> None:
    key = api_stack.stack.create_api_key("eu-tree", act_for_users=True)
    user = "google-oauth2|alice+a.b@example.com"[:128]
    nested = _spawning("top", [_spawning("mid", [_leaf("x"), _leaf("y")]), _leaf("z")])
    task_id = api_stack.submit(_root(nested, user=user), key=key)
    api_stack.until(task_id, lambda v: v["status"] == "succeeded", key=key)
    views = _tree(api_stack, task_id, key)
    assert len(views) == 5  # top, mid, x, y, z
    assert {v["user"] for v in views} == {user}
    status, trace, _ = api_stack.http("GET", f"/tasks/{task_id}/trace", key=key)
    assert status == 200 and trace["user"] == user
    events = _events(api_stack, task_id, key)
    assert len({e["task_id"] for e in events}) == 5 and {e["user"] for e in events} == {user}
    status, page, _ = api_stack.http("GET", "/tasks?include_children=true", key=key)
    assert status == 200 and {t["user"] for t in page["tasks"]} == {user} and len(page["tasks"]) == 5


def test_a_task_without_a_user_acts_for_none(api_stack: ApiStack) -> None:
    key = api_stack.stack.create_api_key("eu-none")
    task_id = api_stack.submit(_root(_spawning("top", [_leaf("x")])), key=key)
    api_stack.until(task_id, lambda v: v["status"] == "succeeded", key=key)
    assert {v["user"] for v in _tree(api_stack, task_id, key)} == {None}


def test_a_subagent_cannot_name_a_user_of_its_own(api_stack: ApiStack) -> None:
    key = api_stack.stack.create_api_key("eu-child-user", act_for_users=True)
    child = {**_leaf("x"), "user": "mallory"}
    task_id = api_stack.submit(_root(_spawning("top", [child]), user="alice"), key=key)
    view = api_stack.until(task_id, lambda v: v["status"] == "succeeded", key=key)
    assert view["children"]["total"] == 0
    status, trace, _ = api_stack.http("GET", f"/tasks/{task_id}/trace", key=key)
    assert status == 200, trace
    results = [e for e in trace["events"] if e.get("type") == "tool_call" and e.get("name") == "spawn_subagents"]
    assert results and results[0]["is_error"] and "user" in json.dumps(results[0]["output"]), results
