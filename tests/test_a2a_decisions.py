"""An A2A client's answer to an approval (a message to an ``input-required`` task) is a decision
of the call it was shown, made once however often the request is sent: against the local stack
with the official JSON-RPC shapes (``api/a2a_server._decide``)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from agentq.api.models import MAX_NOTE_CHARS

from tests.api_support import ApiStack
from tests.helpers import call as tool_call
from tests.test_a2a_server import APPROVAL_TURNS, _agent, _rpc, _send

TWO_APPROVALS: list[dict[str, Any]] = [
    {"text": "", "tool_calls": [tool_call("request_approval", question="Ship to staging?")]},
    {"text": "", "tool_calls": [tool_call("request_approval", question="Delete the production database?")]},
    {"text": "done"},
]


def _call(api_stack: ApiStack, name: str, method: str, params: dict[str, Any], *, key: str | None = "default",
          headers: dict[str, str] | None = None) -> Any:  # fmt: skip
    status, data = _rpc(api_stack, name, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, key=key,
                        headers=headers)  # fmt: skip
    assert status == 200, data
    return data


def _asked(task: dict[str, Any]) -> str:
    """The question of an input-required task's status message (its first line)."""
    return str(task["status"]["message"]["parts"][0]["text"]).split("\n", 1)[0]


@pytest.mark.parametrize("idempotency_key", [True, False], ids=["with-idempotency-key", "by-message-id"])
def test_a_retried_approval_decides_the_call_it_was_sent_for_and_never_the_next_held_one(
    api_stack: ApiStack, idempotency_key: bool
) -> None:
    """A client that sends its 'approve' again (a timeout, a proxy's retry: the same message id
    and text, and Idempotency-Key if it sent one) gets the task as it is: still asking the
    second question. Before, the retry approved the task's next held call, which the person was
    never shown ('Delete the production database?'), and the task completed. A new message
    (another message id) is a new decision, of the call held then."""
    name = _agent(api_stack, TWO_APPROVALS, tools=["request_approval"])
    task = _call(api_stack, name, "SendMessage", _send("go")["params"])["result"]["task"]
    assert _asked(task) == "Ship to staging?"
    approve = _send("approve", taskId=task["id"])["params"]
    once = {"Idempotency-Key": f"click-{uuid.uuid4().hex}"} if idempotency_key else {}
    first = _call(api_stack, name, "SendMessage", approve, headers=once)["result"]["task"]
    assert first["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert _asked(first) == "Delete the production database?"
    retry = _call(api_stack, name, "SendMessage", approve, headers=once)["result"]["task"]
    assert retry["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", retry["status"]
    assert _asked(retry) == "Delete the production database?"
    view = api_stack.http("GET", f"/tasks/{task['id']}")[1]
    assert view["status"] == "paused"
    seen = _send("approve", taskId=task["id"])["params"]  # the second question, seen and answered
    done = _call(api_stack, name, "SendMessage", seen, headers=once)["result"]["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED", done["status"]


@pytest.mark.parametrize(
    ("parts", "field"),
    [
        ([{"text": "approve " + "n" * (MAX_NOTE_CHARS + 1)}], "message.parts"),
        ([{"text": "reject " + "n" * (MAX_NOTE_CHARS + 1)}], "message.parts"),
        ([{"text": "n" * (MAX_NOTE_CHARS + 1)}], "message.parts"),
        ([{"data": {"approved": True, "note": "n" * (MAX_NOTE_CHARS + 1)}}], "note"),
    ],
    ids=["approve-note", "reject-note", "free-text", "data-note"],
)
def test_a_decisions_note_holds_at_most_a_notes_characters_whatever_its_first_word(
    api_stack: ApiStack, parts: list[dict[str, Any]], field: str
) -> None:
    """POST /tasks/{id}/approve (api/models/tasks.py) and MCP's answer hold a note to
    MAX_NOTE_CHARS, and so did A2A's free-text answer; 'approve <note>', 'reject <note>' and a data
    part's note were taken whatever their length. Each is invalid params naming the field, the
    task still paused."""
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    task = _call(api_stack, name, "SendMessage", _send("go")["params"])["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    params = _send("", taskId=task["id"])["params"]
    params["message"]["parts"] = parts
    answer = _call(api_stack, name, "SendMessage", params)
    assert answer.get("error", {}).get("code") == -32602, str(answer)[:300]
    assert answer["error"]["message"].startswith(f"{field}: "), answer["error"]["message"][:200]
    assert api_stack.http("GET", f"/tasks/{task['id']}")[1]["status"] == "paused"
