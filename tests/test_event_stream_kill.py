"""A client follows a task's event stream while the worker running it is SIGKILLed; it drops the
connection after the kill and resumes from the last event it received: every committed event
arrives exactly once, in commit order, the takeover included (real worker processes, the local
API server's stream)."""

from __future__ import annotations

import os
import signal

from agentq.api.client import Client
from agentq.api.models import TaskEvent
from agentq_dev.stack import LocalStack

from tests.helpers import call

# Quick turns up to the kill (at step 5, turn 2's message), slower ones after it: the task must
# still be running when the stream, the test and the kill catch up, also on a busy machine.
TURNS = [
    {"text": f"turn {i}", "latency_seconds": 0.3 if i < 3 else 1.5,
     "tool_calls": [call("lookup", query=str(i), size=20)]}
    for i in range(8)
] + [{"text": "finished"}]  # fmt: skip
BODY = {"goal": "look things up", "provider": "scripted", "script": {"turns": TURNS},
        "constraints": {"tools": ["lookup"]}}  # fmt: skip


def test_a_client_resuming_after_a_worker_kill_receives_every_committed_event_once() -> None:
    with LocalStack(prefix="evkill", workers=2, tool_modules=("tests.effect_tools",),
                    extra_env={"PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))}) as stack:  # fmt: skip
        assert stack.api_server is not None
        client = Client(stack.api_server.url)
        task_id = client.submit(BODY).task_id
        received: list[TaskEvent] = []
        stream = client.iter_events(task_id)
        worker = ""
        for event in stream:
            received.append(event)
            if event.type == "task.status" and event.data["status"] == "running":
                worker = str(event.data["worker"])
            if event.type == "agent.message" and event.data["step"] >= 5:
                break  # mid-task: the worker holding it dies now
        victim = stack.worker_by_id(worker)
        assert victim is not None
        os.kill(victim.pid, signal.SIGKILL)
        stream.close()  # the connection drops too
        last = [e.id for e in received if e.id][-1]
        received += list(client.iter_events(task_id, after=last))

        committed = [e for e in received if e.committed]
        ids = [e.id for e in committed]
        assert len(ids) == len(set(ids))  # nothing twice
        whole = list(client.iter_events(task_id, stream=False))  # the log read afresh, JSON pages
        assert ids == [e.id for e in whole]  # nothing lost, in commit order
        claims = [e.data for e in committed if e.type == "task.status" and e.data["status"] == "running"]
        assert [c["takeover"] for c in claims] == [False, True] and claims[0]["worker"] != claims[1]["worker"]
        texts = [e.data["text"] for e in committed if e.type == "agent.message"]
        assert texts == [t["text"] for t in TURNS]  # each turn once: the dead worker's work is not shown twice
        assert committed[-1].type == "task.status" and committed[-1].data["status"] == "succeeded"
        assert all(e.id is None for e in received if not e.committed)
