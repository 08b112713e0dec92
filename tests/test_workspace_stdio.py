"""A workspace shell writes to /dev/stdout and /dev/stderr as any shell does (``> /dev/stderr``,
``tee /dev/stderr``, Python's ``open('/dev/stdout', 'w')``): each reopens the output pipe through
``/proc/self/fd``, which the kernel allows only to a uid the pipe's inode lets write. A root
worker's pipes are root's (0600), and its sandbox runs as uid 65534 (``sandbox.stage``), so every
such write failed with "Permission denied" until the worker gave the pipes to that uid
(``supervise(pipe_owner=...)``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentq.sandbox.base import ExecRequest
from agentq.sandbox.bwrap import BwrapSandbox
from agentq.sandbox.workspace import WorkspaceSandbox

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")


def test_a_shell_can_write_to_dev_stdout_and_dev_stderr(tmp_path: Path) -> None:
    command = "echo out > /dev/stdout; echo err > /dev/stderr; echo teed | tee /dev/stderr >/dev/null"
    result = WorkspaceSandbox().shell(tmp_path, command, 20)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out\n", "err\nteed\n"), result


def test_python_exec_can_write_to_dev_stdout_and_dev_stderr() -> None:
    """The same for python_exec's sandbox (no workspace), whose pipes are made the same way."""
    code = "open('/dev/stdout', 'w').write('out\\n'); open('/dev/stderr', 'w').write('err\\n')"
    result = BwrapSandbox().run(ExecRequest(code=code, timeout_seconds=10, memory_mb=256))
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out\n", "err\n"), result
