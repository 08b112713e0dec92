"""A message racing its A2A task's end (``api/a2a_server.py``): the server refuses a message to an
ended task (-32004, 'an A2A task never restarts') on its own read of the task, and the write
that takes a message checks the end again (``Messages.accept(reopen_ended=False)``), so a task
that ends between the two is refused there too, never reopened."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.api_support import ApiStack
from tests.test_a2a_server import _agent, _rpc, _send


def _call(api_stack: ApiStack, name: str, params: dict[str, Any]) -> Any:
    status, data = _rpc(api_stack, name, {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params})
    assert status == 200, data
    return data


def test_a_message_racing_its_tasks_end_is_refused_and_never_reopens_a_completed_a2a_task(
    api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follow-up is read while its task runs, and the task completes before the message is
    taken (the send waits for the worker's end: the race's window, held open). Before, the
    write took it as agentq's follow-up and reopened the task (succeeded -> queued): a client
    that saw COMPLETED (its stream, its push) saw it working again and completed a second time.
    Now -32004, the task still completed with its first answer."""
    from agentq.api import a2a_server
    from agentq.control.conversations import send_message as real

    def after_the_end(store: Any, queues: Any, task_id: str, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + 60
        while store.tasks.get(task_id).status.value != "succeeded":  # the worker ends the task meanwhile
            assert time.monotonic() < deadline, "the task never ended"
            time.sleep(0.05)
        return real(store, queues, task_id, *args, **kwargs)

    monkeypatch.setattr(a2a_server, "send_message", after_the_end)
    name = _agent(api_stack, [{"text": "first answer", "latency_seconds": 2}, {"text": "second answer"}])
    params = _send("go")["params"]
    params["configuration"] = {"returnImmediately": True}
    task_id = _call(api_stack, name, params)["result"]["task"]["id"]
    follow = _send("and another thing", taskId=task_id)["params"]
    follow["configuration"] = {"returnImmediately": True}
    answer = _call(api_stack, name, follow)
    assert answer.get("error", {}).get("code") == -32004, str(answer)[:300]
    assert "has ended (succeeded)" in answer["error"]["message"]
    view = api_stack.http("GET", f"/tasks/{task_id}")[1]
    assert view["status"] == "succeeded" and view["result"] == "first answer"
