"""Running code inside the sandbox Lambda function, one invocation after another.

In AWS the isolation is the function itself: its own execution environment (a microVM) with
a role that grants nothing, in a VPC with no route out, a read-only root filesystem and
``/tmp`` as the only writable place. What this module adds is what keeps one invocation
from reaching the next one in the same warm environment (a different task, perhaps a
different tenant) and from reaching the function's own process:

- the code runs in a child process (``runner.py``: rlimits and the seccomp filter, so no
  sockets, not even to the Lambda Runtime API on localhost, no new processes, no signals
  to other processes), with an empty environment, in ``/tmp``;
- this process is made non-dumpable, so the child cannot read its ``/proc`` files (the
  environment holds the role's credentials) or attach to it, and a child subreaper, so a
  process that somehow escaped its group is still reparented here and can be found;
- before and after each run every descendant is killed and ``/tmp`` is emptied; if either
  cannot be verified, ``EnvironmentDirty`` is raised and the function's handler exits the
  process, so Lambda discards the environment instead of reusing it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import shutil
import signal
import stat
import sys
import time

from agentq.sandbox.base import ExecRequest, ExecResult, SandboxLimits
from agentq.sandbox.bwrap import runner_source
from agentq.sandbox.supervise import fs_usage, supervise

CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp"}
SWEEP_ROUNDS = 50


class EnvironmentDirty(RuntimeError):
    """Leftover processes or files could not be removed: this environment must not run
    another call."""


def harden_process() -> None:
    """Non-dumpable (no /proc/<pid>/environ, mem or ptrace for same-uid processes) and a
    child subreaper. Called once, when the function's module loads."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    pr_set_dumpable, pr_set_child_subreaper = 4, 36
    for option, value in ((pr_set_dumpable, 0), (pr_set_child_subreaper, 1)):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (reparented orphans included, thanks to the subreaper)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants() -> bool:
    """SIGKILL everything below this process until nothing is left; False if that never happened."""
    me = os.getpid()
    for _ in range(SWEEP_ROUNDS):
        _reap()
        alive = descendants(me)
        if not alive:
            return True
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    _reap()
    return not descendants(me)


def _make_removable(root: str) -> None:
    """Give the owner rwx on every directory under ``root``: the code may have made some
    read-only or unlistable. Runs when the code's processes are dead, so nothing changes
    underneath it; symlinks are neither followed nor changed."""
    for top, dirs, _ in os.walk(root, onerror=lambda _: None):
        for name in dirs:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                with contextlib.suppress(OSError):
                    os.chmod(path, stat.S_IRWXU)


def wipe(root: str) -> bool:
    """Remove everything under ``root`` (never following a symlink out of it); True if empty."""
    with contextlib.suppress(OSError):
        os.chmod(root, stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO | stat.S_ISVTX)
    _make_removable(root)
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return not os.listdir(root)


class ScratchRunner:
    """Runs one script at a time in ``root`` (``/tmp`` in Lambda), leaving nothing behind.

    Only for a process that exists to run sandboxed code (the sandbox function): its cleanup
    kills every descendant of the calling process and empties ``root``.
    """

    name = "lambda"

    def __init__(self, root: str = "/tmp", limits: SandboxLimits | None = None) -> None:
        self.root = root
        self.limits = limits or SandboxLimits()
        self.python = sys.executable
        self._runner = runner_source()

    def clean(self) -> None:
        if not kill_descendants():
            raise EnvironmentDirty("processes left by an earlier run could not be killed")
        if not wipe(self.root):
            raise EnvironmentDirty(f"{self.root} could not be emptied")

    def run(self, request: ExecRequest) -> ExecResult:
        self.clean()
        config = {
            "cpu_seconds": math.ceil(request.timeout_seconds) + 1,
            "memory_bytes": request.memory_mb * 1024 * 1024,
            "max_file_bytes": self.limits.max_file_bytes,
            "max_open_files": self.limits.max_open_files,
            "max_code_bytes": self.limits.max_code_bytes,
            "expect_namespaces": False,
        }
        try:
            result = supervise(
                [self.python, "-I", "-S", "-B", "-u", "-c", self._runner, json.dumps(config)],
                code=request.code.encode("utf-8"),
                timeout=request.timeout_seconds,
                limits=self.limits,
                isolation=self.name,
                usage_path=lambda: self.root,
                baseline=fs_usage(self.root),
                cwd=self.root,
                env=dict(CHILD_ENV),
                close_fds=True,
            )
        finally:
            self.clean()
        return result
