"""``ListTasks`` of agentq's A2A server against the local stack with auth on (the same
``api_stack`` as tests/test_a2a_server.py): its ``status`` filter sees a task as ``GetTask``
shows it (a task waiting for a credential is ``auth-required``, not ``input-required``)."""

from __future__ import annotations

from typing import Any

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
