"""``ListTasks`` of agentq's A2A server against the local stack with auth on (the same
``api_stack`` as tests/test_a2a_server.py): its ``status`` filter sees a task as ``GetTask``
shows it (a task waiting for a credential is ``auth-required``, not ``input-required``); a
``pageToken`` it did not issue is invalid params naming it, never an internal error; where it
departs from the protocol (the order, ``totalSize``), it does what docs/PROTOCOLS.md says."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.api_support import ApiStack
from tests.test_a2a_server import APPROVAL_TURNS, _agent, _rpc, _send


def _call(api_stack: ApiStack, name: str, method: str, params: dict[str, Any]) -> Any:
    status, data = _rpc(api_stack, name, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    assert status == 200, data
    return data


def _ids(api_stack: ApiStack, name: str, params: dict[str, Any]) -> list[str]:
    return [t["id"] for t in _call(api_stack, name, "ListTasks", params)["result"].get("tasks", [])]


def test_list_tasks_filtered_by_auth_required_finds_the_task_waiting_for_a_credential(api_stack: ApiStack) -> None:
    """A pause for a vault credential is ``auth-required`` in ``GetTask``; filtered by that
    state ``ListTasks`` lists it (it read every paused task as ``input-required`` before), and
    filtered by ``input-required`` it does not."""
    ask = {"name": "request_credential", "input": {"name": "jira", "host": "jira.example.com", "reason": "to file it"}}
    name = _agent(api_stack, [{"text": "", "tool_calls": [ask]}, {"text": "filed"}], tools=["request_credential"])
    task = _call(api_stack, name, "SendMessage", _send("file the ticket")["params"])["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_AUTH_REQUIRED"
    assert _ids(api_stack, name, {"status": "TASK_STATE_AUTH_REQUIRED"}) == [task["id"]]
    assert _ids(api_stack, name, {"status": "TASK_STATE_INPUT_REQUIRED"}) == []
    listed = _call(api_stack, name, "ListTasks", {"status": "TASK_STATE_AUTH_REQUIRED"})["result"]["tasks"]
    assert listed[0]["status"]["state"] == "TASK_STATE_AUTH_REQUIRED"


def test_list_tasks_filtered_by_input_required_finds_the_task_waiting_for_an_approval(api_stack: ApiStack) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    task = _call(api_stack, name, "SendMessage", _send("ship it")["params"])["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert _ids(api_stack, name, {"status": "TASK_STATE_INPUT_REQUIRED"}) == [task["id"]]
    assert _ids(api_stack, name, {"status": "TASK_STATE_AUTH_REQUIRED"}) == []


def _token(sk: Any) -> str:
    """A token in the server's own envelope (base64url of ``{"a2a": <index key>}``), around a key
    it never issued."""
    return base64.urlsafe_b64encode(json.dumps({"a2a": sk}).encode()).decode().rstrip("=")


@pytest.mark.parametrize("sk", ["abc", "", "000000000000001", "000000000000001#", "#abc", "1#abc", 7])
def test_a_page_token_that_is_not_one_this_server_issued_is_invalid_params_not_an_internal_error(
    api_stack: ApiStack, sk: Any
) -> None:
    """A token that decodes to a key of another shape reached the tenant index's listing, whose
    split of the key raised: -32603 "list index out of range". It is -32602 naming ``pageToken``."""
    name = _agent(api_stack, [{"text": "x"}])
    error = _call(api_stack, name, "ListTasks", {"pageToken": _token(sk)})["error"]
    assert error["code"] == -32602 and "pageToken" in error["message"], error


def test_the_page_token_a_listing_issues_is_taken_back(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "x"}])
    sent = [
        _call(api_stack, name, "SendMessage", _send(f"task {i}")["params"])["result"]["task"]["id"] for i in range(2)
    ]
    first = _call(api_stack, name, "ListTasks", {"pageSize": 1})["result"]
    second = _call(api_stack, name, "ListTasks", {"pageSize": 1, "pageToken": first["nextPageToken"]})["result"]
    assert [t["id"] for t in first["tasks"] + second["tasks"]] == sent[::-1]


def test_list_tasks_total_size_is_the_pages_count_as_protocols_md_says(api_stack: ApiStack) -> None:
    """A documented departure (docs/PROTOCOLS.md, "ListTasks: where it departs from the
    protocol"): ``totalSize`` counts the page, the total only when one page holds every match;
    counting the rest would read every task of the tenant."""
    name = _agent(api_stack, [{"text": "x"}])
    for i in range(3):
        _call(api_stack, name, "SendMessage", _send(f"task {i}")["params"])
    page = _call(api_stack, name, "ListTasks", {"pageSize": 1})["result"]
    assert len(page["tasks"]) == 1 and page["nextPageToken"] and page["totalSize"] == 1
    whole = _call(api_stack, name, "ListTasks", {})["result"]
    assert len(whole["tasks"]) == 3 and not whole.get("nextPageToken") and whole["totalSize"] == 3
    protocols = (Path(__file__).resolve().parent.parent / "docs" / "PROTOCOLS.md").read_text(encoding="utf-8")
    assert "**`totalSize` is the number of tasks in this page**" in protocols


def test_list_tasks_is_ordered_by_creation_not_last_update_as_protocols_md_says(api_stack: ApiStack) -> None:
    """A documented departure (docs/PROTOCOLS.md): the older task, changed last (its approval
    answered), is still listed after the newer one; its status timestamp is its last update."""
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    older = _call(api_stack, name, "SendMessage", _send("first")["params"])["result"]["task"]["id"]
    newer = _call(api_stack, name, "SendMessage", _send("second")["params"])["result"]["task"]["id"]
    done = _call(api_stack, name, "SendMessage", _send("approve", taskId=older)["params"])["result"]["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    listed = _call(api_stack, name, "ListTasks", {})["result"]["tasks"]
    assert [t["id"] for t in listed] == [newer, older]
    assert listed[1]["status"]["timestamp"] > listed[0]["status"]["timestamp"]  # changed last, listed second
    protocols = (Path(__file__).resolve().parent.parent / "docs" / "PROTOCOLS.md").read_text(encoding="utf-8")
    assert "**Tasks are listed newest created first**" in protocols


BIG_RESULT = "r" * 250_000  # a long answer: 250 KB, twice in a view with includeArtifacts


def _big_agent(api_stack: ApiStack) -> str:
    return _agent(
        api_stack, [{"text": BIG_RESULT}], constraints={"max_output_tokens": 128_000, "max_tokens": 1_000_000}
    )


def _completed(api_stack: ApiStack, name: str) -> str:
    task = _call(api_stack, name, "SendMessage", _send("go")["params"])["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"]["state"]
    return str(task["id"])


def _raw_list(api_stack: ApiStack, name: str, params: dict[str, Any]) -> bytes:
    """The ListTasks answer's bytes, as they went over the wire."""
    import urllib.request

    body = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": params}
    request = urllib.request.Request(f"{api_stack.url}/a2a/{name}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "A2A-Version": "1.0",
                                              "Authorization": f"Bearer {api_stack.key}"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as answer:
        return bytes(answer.read())


def test_a_list_tasks_page_fits_the_listing_budget_and_the_rest_follow_its_token(api_stack: ApiStack) -> None:
    """A page stops at LISTING_PAGE_BYTES, as GET /tasks' does, and hands the rest to
    ``nextPageToken``: every task is listed once, whole. Before, each task's result was in the
    answer whole, twice with includeArtifacts, whatever the page's size: 5 tasks of 250 KB results
    answered 2.5 MB (12 answered 6 MB, past a Lambda's answer)."""
    from agentq.api.models import LISTING_PAGE_BYTES

    name = _big_agent(api_stack)
    ids = [_completed(api_stack, name) for _ in range(5)]
    listed: list[str] = []
    params: dict[str, Any] = {"pageSize": 5, "includeArtifacts": True}
    for _ in range(5):
        raw = _raw_list(api_stack, name, params)
        assert len(raw) <= LISTING_PAGE_BYTES, f"ListTasks answered {len(raw):,} bytes"
        page = json.loads(raw)["result"]
        for task in page["tasks"]:
            assert task["status"]["message"]["parts"][0]["text"] == BIG_RESULT  # whole, not cut
            assert "truncated" not in task["metadata"]["agentq"]
        listed += [t["id"] for t in page["tasks"]]
        if not page.get("nextPageToken"):
            break
        params = {**params, "pageToken": page["nextPageToken"]}
    assert listed == ids[::-1]


def test_a_task_bigger_than_a_list_tasks_page_is_listed_cut_and_get_task_reads_it_whole(
    api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One task alone over the page's budget (here a budget of 300 KB, a view of 500 KB) is
    still listed, its long texts cut with a note and ``metadata.agentq.truncated``; GetTask
    answers it whole."""
    from agentq.api import a2a_listing

    monkeypatch.setattr(a2a_listing, "PAGE_BYTES", 300_000)
    name = _big_agent(api_stack)
    task_id = _completed(api_stack, name)
    raw = _raw_list(api_stack, name, {"includeArtifacts": True})
    assert len(raw) <= 300_000 + 4_096, f"ListTasks answered {len(raw):,} bytes"
    (task,) = json.loads(raw)["result"]["tasks"]
    said = task["status"]["message"]["parts"][0]["text"]
    assert task["id"] == task_id and task["metadata"]["agentq"]["truncated"] is True
    assert said.startswith("r" * 1_000) and "GetTask reads the whole task" in said and len(said) < len(BIG_RESULT)
    whole = _call(api_stack, name, "GetTask", {"id": task_id})["result"]
    assert whole["status"]["message"]["parts"][0]["text"] == BIG_RESULT
