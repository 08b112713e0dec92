"""Talking to a task through the local stack's workers: the Python client's send/interrupt,
`agentq send --wait` and `agentq chat` driven through stdin as a person types."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

import agentq
from agentq.api.client import Client, Conflict
from agentq.api.models import MessageEvent
from agentq.core.models import TaskStatus

from tests.api_support import ROOT, ApiStack
from tests.helpers import agentq_process, run_agentq, wait_for

CHATTY = {
    "goal": "greet",
    "provider": "scripted",
    "script": {"turns": [{"text": "hello"}, {"text": "second answer"}, {"text": "third answer"}]},
}


@pytest.fixture
def client(api_stack: ApiStack) -> Client:
    return agentq.Client(api_stack.url, api_stack.key)


def test_the_client_sends_a_follow_up_and_the_trace_shows_the_exchange(client: Client) -> None:
    task_id = client.submit(CHATTY).task_id
    assert client.wait(task_id, timeout=60, poll=0.05).result == "hello"
    sent = client.send(task_id, "and then?")
    assert sent.reopened and sent.status is TaskStatus.QUEUED
    view = client.wait(task_id, timeout=60, poll=0.05)
    assert view.status is TaskStatus.SUCCEEDED and view.result == "second answer"
    assert [(m.text, m.delivered) for m in client.messages(task_id)] == [("and then?", True)]
    said = [e for e in client.iter_trace(task_id) if isinstance(e, MessageEvent)]
    assert [e.text for e in said] == ["and then?"]
    client.close_conversation(task_id)
    with pytest.raises(Conflict) as refused:
        client.send(task_id, "one more")
    assert refused.value.code == "message_refused"


def test_agentq_send_waits_for_the_answer_and_chat_answers_each_line(api_stack: ApiStack, client: Client) -> None:
    task_id = client.submit(CHATTY).task_id
    client.wait(task_id, timeout=60, poll=0.05)
    env = {**api_stack.cli_env(), "AGENTQ_POLL_SECONDS": "0.05"}
    sent = run_agentq(["send", task_id, "more please", "--wait"], env, timeout=120, cwd=ROOT)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == "second answer"
    chat = subprocess.run(
        [sys.executable, "-m", "agentq", "chat", task_id],
        input="and finally?\n", capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    assert chat.returncode == 0, chat.stderr
    assert "agent> third answer" in chat.stdout
    assert [m.text for m in client.messages(task_id)] == ["more please", "and finally?"]


PAUSING = {
    "goal": "wait for a person",
    "provider": "scripted",
    "script": {"turns": [{"text": "", "tool_calls": [{"name": "request_approval", "input": {"question": "Go on?"}}]},
                         {"text": "went on"}]},
    "constraints": {"tools": ["request_approval"]},
}  # fmt: skip


def test_ctrl_c_in_agentq_chat_on_a_paused_task_says_why_it_cannot_interrupt_and_follows_on(
    api_stack: ApiStack, client: Client
) -> None:
    """``POST /interrupt`` takes a running or queued task only: a task paused for an approval is
    409 (storage.messages.interrupt). The chat's Ctrl-C asked for one unguarded, so the refusal
    ended the chat with an error; now it says why, follows on (an approval decided elsewhere
    goes on in it), and a second Ctrl-C leaves as ever."""
    task_id = client.submit(PAUSING).task_id
    client.wait_for(task_id, lambda v: v.status is TaskStatus.PAUSED, timeout=60, poll=0.05)
    env = {**api_stack.cli_env(), "AGENTQ_POLL_SECONDS": "0.05"}
    chat = agentq_process(["chat", task_id], env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    assert chat.stderr is not None
    try:
        hub = api_stack.stack.api_server.hub if api_stack.stack.api_server else None
        assert hub is not None
        # The chat follows the task once its event stream is attached to this process's hub.
        wait_for(lambda: (p := hub.pollers.get(task_id)) is not None and p.subscribers, what="the chat following")
        chat.send_signal(signal.SIGINT)
        said = [chat.stderr.readline(), chat.stderr.readline()]
        while not said[-1].strip():  # the Ctrl-C's own new line
            said.append(chat.stderr.readline())
        assert said[0].startswith(f"chatting with {task_id} (paused)"), said
        assert said[-1].strip() == (
            f"(cannot interrupt: task {task_id} is paused: only a running or queued task can be interrupted; "
            "Ctrl-C again leaves the chat)"
        ), said
        assert chat.poll() is None  # still following
        assert client.get(task_id).status is TaskStatus.PAUSED
        chat.send_signal(signal.SIGINT)
        assert chat.wait(timeout=60) == 130
    finally:
        if chat.poll() is None:
            chat.kill()
            chat.wait()
