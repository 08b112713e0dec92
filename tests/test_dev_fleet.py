"""`agentq dev` keeps its workers up as a fleet: a worker SIGKILLed while it holds a task is
replaced (one line names it, how it ended and its replacement), the API answers throughout and
the task resumes and succeeds; a worker that dies at start over and over is restarted with a
growing back-off, never in a tight loop (devstack/agentq_dev/fleet.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentq_dev.fleet import RestartBackoff, describe_exit
from agentq_dev.stack import LocalStack

from tests.helpers import agentq_process, call

ROOT = Path(__file__).resolve().parent.parent
# Quick turns up to the kill (at step 4), slower ones after it: the task must still be running
# when the test has seen step 4 and kills the worker, also on a busy machine.
TURNS = [
    {"text": f"turn {i}", "latency_seconds": 0.3 if i < 2 else 1.0,
     "tool_calls": [call("note_write", key=f"k{i}", value=str(i))]}
    for i in range(10)
] + [{"text": "finished"}]  # fmt: skip


def _http(url: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, json.loads(resp.read())


def _claims(api: str, task_id: str) -> list[str]:
    status, trace = _http(f"{api}/tasks/{task_id}/trace?limit=200")
    assert status == 200, trace
    return [e["worker"] for e in trace["events"] if e["type"] == "transition" and e["event"] == "claimed"]


class _Lines:
    """A pipe read on a thread (so the process never blocks on it), its lines kept."""

    def __init__(self, pipe: Any) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: Any) -> None:
        for line in pipe:
            self.lines.append(line.rstrip("\n"))

    def matching(self, pattern: str) -> re.Match[str] | None:
        return next((m for line in list(self.lines) if (m := re.search(pattern, line))), None)


def test_a_worker_sigkilled_under_agentq_dev_is_replaced_and_its_task_resumes_with_the_api_up() -> None:
    dev = agentq_process(
        ["dev", "--workers", "1"], dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert dev.stdout is not None and dev.stderr is not None
        errors = _Lines(dev.stderr)
        api, workers = "", ""
        for line in dev.stdout:
            if line.strip().startswith("export AGENTQ_URL="):
                api = line.strip().partition("=")[2]
            if line.strip().startswith("workers "):
                workers = line.split()[-1]
            if line.startswith("Ctrl-C stops everything"):
                break
        out = _Lines(dev.stdout)
        assert api and workers.isdigit(), (api, workers, errors.lines)
        status, created = _http(f"{api}/tasks", {
            "goal": "write ten notes", "provider": "scripted", "script": {"turns": TURNS},
            "constraints": {"tools": ["note_write"], "max_steps": 30},
        })  # fmt: skip
        assert status == 202, created
        task_id = created["task_id"]

        deadline = time.monotonic() + 60
        while True:  # the worker holds the task and has committed a few steps
            _, view = _http(f"{api}/tasks/{task_id}")
            if view["status"] == "running" and view["step"] >= 4:
                break
            assert time.monotonic() < deadline and view["status"] in ("queued", "running"), view
            time.sleep(0.05)
        holder = _claims(api, task_id)[-1]
        pid = int(holder.rsplit(":", 1)[1])
        assert pid == int(workers)  # the only worker
        os.kill(pid, signal.SIGKILL)

        seen = set()
        while True:  # the API answers while the worker is replaced and the task resumes
            status, view = _http(f"{api}/tasks/{task_id}")
            assert status == 200
            seen.add(view["status"])
            if view["status"] in ("succeeded", "failed", "cancelled", "timed_out", "cost_exceeded"):
                break
            assert time.monotonic() < deadline + 60, (view, errors.lines)
            time.sleep(0.1)
        assert dev.poll() is None  # `agentq dev` is still up
        replaced = errors.matching(rf"worker {pid} killed by SIGKILL; worker (\d+) replaces it") or out.matching(
            rf"worker {pid} killed by SIGKILL; worker (\d+) replaces it"
        )
        assert replaced is not None, (errors.lines, out.lines)
        replacement = int(replaced.group(1))
        assert view["status"] == "succeeded" and view["result"] == "finished", view
        claims = _claims(api, task_id)
        assert len(claims) == 2 and claims[0] == holder and claims[1].endswith(f":{replacement}")
        assert view["latency"]["resumes"] == 1
    finally:
        dev.send_signal(signal.SIGINT)
        code = dev.wait(timeout=60)
    assert code == 0


def test_a_worker_that_dies_at_start_over_and_over_is_restarted_with_a_growing_back_off() -> None:
    said: list[str] = []
    stack = LocalStack(
        prefix=f"loop{uuid.uuid4().hex[:8]}", workers=1, api=False, sweep_every=None, supervise=True,
        restart_backoff=RestartBackoff(grace_seconds=60, first_delay_seconds=1, max_delay_seconds=4),
        extra_env={"AGENTQ_TOOL_MODULES": "tests.no_such_tool_module"}, announce=said.append,
    )  # fmt: skip
    with stack:
        deadline = time.monotonic() + 90
        while len(stack.backoffs) < 3:  # three quick exits held back: 1 s, 2 s, 4 s
            assert time.monotonic() < deadline, said
            time.sleep(0.1)
        replaced = list(stack.replacements)
    assert stack.backoffs[:3] == [1, 2, 4]
    # Only the first exit was replaced at once; every later start waited out its back-off.
    assert replaced[0].delay_seconds == 0 and all(r.delay_seconds > 0 for r in replaced[1:])
    assert len(replaced) <= 3
    assert all(r.returncode == 2 for r in replaced)
    assert re.search(r"worker \d+ exited with code 2 [\d.]+s after it started \(2 quick exits in a row\): "
                     r"its replacement starts in 1s", "\n".join(said)), said  # fmt: skip


@pytest.mark.parametrize(
    ("lived", "before", "delay", "quick"),
    [(30.0, 5, 0.0, 0), (0.5, 0, 0.0, 1), (0.5, 1, 1.0, 2), (0.5, 2, 2.0, 3), (0.5, 20, 60.0, 21)],
)
def test_the_restart_back_off_starts_after_a_quick_exit_repeats_and_doubles_up_to_a_minute(
    lived: float, before: int, delay: float, quick: int
) -> None:
    restart = RestartBackoff().after_exit(lived, before)
    assert (restart.delay_seconds, restart.quick_exits) == (delay, quick)


def test_a_worker_s_end_is_described_by_its_signal_or_exit_code() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(2) == "exited with code 2"
    assert describe_exit(0) == "exited with code 0"
