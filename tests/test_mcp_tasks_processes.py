"""An MCP task handle outlives the processes that made it: the official ``mcp`` client gets a
handle from an API server in a process of its own (tests/api_process.py); the worker running the
task is SIGKILLed mid-run (after the agent's side effect, in its next model call) and so is the
API process; ``tasks/get`` on the same handle answers from a new API process, a new worker takes
the task over, and the result arrives through ``tasks/get`` (from a third API process) with the
side effect done exactly once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

from agentq.worker import WorkerConfig
from agentq_dev.stack import LocalStack

from tests.api_support import ROOT
from tests.helpers import call as tool_call
from tests.mcp_tasks_client import TERMINAL, AgentqTasks, get_task, until

TURNS: list[dict[str, Any]] = [
    {"text": "", "tool_calls": [tool_call("charge_card", amount_cents=500, memo="once")]},
    {"text": "charged once", "latency_seconds": 6.0},  # the worker is killed in this model call
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _api_process(stack: LocalStack, port: int) -> tuple[subprocess.Popen[str], str]:
    env = stack.env(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])))
    proc = subprocess.Popen([sys.executable, "-m", "tests.api_process", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed once it listens
    assert line.startswith("listening "), line
    return proc, line.split()[1]


def _kill(proc: Any) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _tasks_client(url: str, work: Any) -> Any:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp_types.version import LATEST_MODERN_VERSION

    # The tasks extension's one wire, pinned: "auto" probes server/discover first and, should a
    # new API process take over 10 s to answer it (the mcp client's probe timeout: seen with two
    # suites on the machine), falls back to the legacy handshake, where tasks/* is -32021.
    async def run() -> Any:
        async with Client(streamable_http_client(f"{url}/mcp"), mode=LATEST_MODERN_VERSION,
                          extensions=[AgentqTasks()]) as client:  # fmt: skip
            return await work(client)

    return anyio.run(run)


def _view(url: str, task_id: str) -> dict[str, Any]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/tasks/{task_id}", timeout=30) as resp:
        return dict(json.loads(resp.read()))


def test_the_handle_survives_a_killed_api_and_a_killed_worker_and_the_result_comes_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    stack = LocalStack(
        prefix=f"mcpt{uuid.uuid4().hex[:8]}",
        workers=1,
        api=False,
        worker_config=WorkerConfig(lease_seconds=3.0, heartbeat_seconds=1.0),
        tool_modules=("agentq.core.tools.examples", "tests.effect_tools"),
        extra_env={"AGENTQ_TEST_LEDGER": str(ledger)},
    ).start()
    port = _free_port()
    api, url = _api_process(stack, port)
    try:
        import json
        import urllib.request

        agent = {"name": "charger", "provider": "scripted", "script": {"turns": TURNS}, "tools": ["charge_card"]}
        request = urllib.request.Request(f"{url}/agents", data=json.dumps(agent).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 201

        async def start(client: Any) -> Any:
            await client.list_tools()
            return await client.session.call_tool("charger", {"goal": "charge once"}, allow_claimed=True)

        handle = _tasks_client(url, start)
        assert handle.result_type == "task"
        deadline = time.monotonic() + 60
        # The charge is made and its step committed: the worker is in the slow model call after it.
        while not (ledger.exists() and ledger.read_text().strip() and _view(url, handle.task_id)["step"] >= 1):
            assert time.monotonic() < deadline, _view(url, handle.task_id)
            time.sleep(0.05)
        (worker,) = stack.processes
        _kill(worker)
        assert _view(url, handle.task_id)["status"] == "running"  # the dead worker's, until its lease ends
        stack.processes.remove(worker)

        _kill(api)  # the API process that returned the handle is gone too
        api, url = _api_process(stack, port)
        seen = _tasks_client(url, lambda c: get_task(c.session, handle.task_id))
        assert seen.task_id == handle.task_id and seen.status == "working"  # no worker holds it yet
        stack.spawn_worker()

        _kill(api)  # and the API once more: the result is read from a third process
        api, url = _api_process(stack, port)
        ended = _tasks_client(url, lambda c: until(c.session, handle.task_id, TERMINAL, timeout=120))
        again = _tasks_client(url, lambda c: get_task(c.session, handle.task_id))
        final = _view(url, handle.task_id)
    finally:
        _kill(api)
        stack.stop()
    assert ended.status == "completed" and ended.result is not None, ended
    assert ended.result["structuredContent"]["result"] == "charged once"
    assert again.result == ended.result
    assert len(ledger.read_text().splitlines()) == 1  # the side effect ran once across the kills
    assert final["status"] == "succeeded" and final["latency"]["resumes"] == 1, final  # taken over once
