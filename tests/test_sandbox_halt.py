"""A workspace sandbox is killed as soon as its run is told its task is gone (``halt``, the run's
``LeaseState.lost``: a stop's mark, a cancel, a takeover, learnt by a refused write, a credential
read or the heartbeat's look): bubblewrap's process group at the supervisor's next poll
(``sandbox.supervise.POLL_SECONDS``), every process of the shell with its PID namespace, not when
the command's own limit comes (``MAX_SHELL_SECONDS``). A real bubblewrap shell; its processes
are watched from this host."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agentq.sandbox.base import HALTED, ExecResult, SandboxLimits
from agentq.sandbox.workspace import WorkspaceSandbox

from tests.sandbox_support import host_processes_in_namespace, processes_with


def test_a_workspace_shell_is_killed_as_soon_as_its_run_is_told_its_task_is_gone() -> None:
    """``halt`` (the run's ``LeaseState.lost``) set while a shell runs: bubblewrap's process group
    is killed at the supervisor's next poll, every process of it with its PID namespace."""
    halt, tag = threading.Event(), f"halt{time.time_ns()}"
    result: list[ExecResult] = []
    with tempfile.TemporaryDirectory() as directory:
        sandbox, command = WorkspaceSandbox(), f"sleep 600 & sleep 600; : {tag}"
        run = threading.Thread(target=lambda: result.append(sandbox.shell(Path(directory), command, 600, halt=halt)))
        run.start()
        _until(lambda: bool(processes_with(tag)), "the shell started")
        namespace = os.readlink(f"/proc/{processes_with(tag)[0]}/ns/pid")
        _until(lambda: len(host_processes_in_namespace(namespace)) >= 3, "its background job started")
        halted = time.monotonic()
        halt.set()
        run.join(timeout=10)
        took = time.monotonic() - halted
    assert not run.is_alive() and took < 2.0, took
    assert not processes_with(tag) and not host_processes_in_namespace(namespace)  # the background job too
    assert result[0].limit == "halted" and not result[0].timed_out
    assert result[0].explain(600, 0, SandboxLimits()) == HALTED


def _until(done: Callable[[], bool], what: str, seconds: float = 30) -> None:
    end = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < end, f"{what}: not within {seconds:.0f} s"
        time.sleep(0.02)
