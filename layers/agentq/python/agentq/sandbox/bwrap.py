"""Code execution on the worker's own host, isolated by bubblewrap (``bwrap``).

Each call gets new user, PID, mount, network, IPC, UTS and cgroup namespaces: the code sees
a root filesystem built for it (the system's ``/usr`` and the interpreter read-only, a fresh
read-only ``/proc`` of its own PID namespace, a minimal read-only ``/dev``) and one writable place, a
private size-capped tmpfs at ``/tmp`` that is its working directory and vanishes with it.
It runs as uid 65534 without capabilities, cannot create user namespaces again, has only a
loopback device, and dies with the worker. Inside, ``runner.py`` adds rlimits and a seccomp
filter before the script runs; outside, the supervisor enforces wall-clock, output, disk and
file-count limits. bwrap's own init (PID 1 inside) has neither the filter nor the rlimits, so
nothing may write its memory: ``/proc`` is read-only (no ``/proc/1/mem`` opened for writing),
and the filter refuses ptrace, ``process_vm_writev`` and pidfds.

Outside its namespace the sandbox is never root. bwrap maps the sandbox's uid to the uid it is
started as, so a worker that is not root gets its own uid there; a worker that is root starts
bwrap as uid and gid 65534 instead (``outside_owner``), through ``stage.py``, which binds every
path bwrap mounts where that uid can reach it, in a mount namespace of bwrap's alone. The code is
then 65534 inside and out: a root-only file that a mount shows it stays unwritable, and the
kernel's per-user limits (``RLIMIT_NPROC``) hold. What the worker makes for the sandbox to write
(the workspace, the egress socket) it gives to that uid.

Fail closed: if ``bwrap`` is missing, or cannot set up any part of this (user namespaces
disabled, as in a default Docker or Fargate container, or refused to uids but root), it reports
the problem and runs nothing, and ``run`` raises ``SandboxUnavailable`` with bwrap's own words.
A root worker never runs the sandbox as root instead. See docs/SANDBOX.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentq.sandbox import runner, stage
from agentq.sandbox.base import ExecRequest, ExecResult, SandboxLimits, SandboxUnavailable
from agentq.sandbox.supervise import supervise

SANDBOX_UID = 65534
WORKDIR = "/tmp"
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": WORKDIR, "TMPDIR": WORKDIR}
# Optional files the interpreter is happier with (a faster dynamic loader, local time).
_OPTIONAL_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_TOP_LEVEL = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The settings by which a kernel refuses user namespaces to uids other than root: (file, the
# value that refuses, what to say).
_USERNS_SWITCHES = (
    ("/proc/sys/kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone is 0 (Debian's switch)"),
    ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces is 0"),
    (
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
        "1",
        "kernel.apparmor_restrict_unprivileged_userns is 1 (Ubuntu's; or give bwrap an AppArmor profile allowing userns)",
    ),
)


def outside_owner() -> tuple[int, int] | None:
    """The uid and gid the sandbox's processes are outside their user namespace when that is not
    the worker's own: 65534 when the worker is root (bwrap is started as it), None otherwise
    (bwrap runs as the worker, whose uid the sandbox then is). A directory or socket the worker
    makes for the sandbox to write must belong to it."""
    return (SANDBOX_UID, SANDBOX_UID) if os.geteuid() == 0 else None


def userns_refusals() -> list[str]:
    """This host's settings that refuse user namespaces to a uid that is not root, as found."""
    found = []
    for path, refusing, say in _USERNS_SWITCHES:
        try:
            with open(path, encoding="ascii") as f:
                value = f.read().strip()
        except OSError:
            continue
        if value == refusing:
            found.append(say)
    return found


def runner_source() -> str:
    return Path(runner.__file__).read_text(encoding="utf-8")


def interpreter() -> str:
    """The real interpreter behind a venv: the sandbox sees none of the venv's packages."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def filesystem_args(python: str) -> list[str]:
    """Read-only system paths (merged-/usr symlinks kept as symlinks) and the interpreter."""
    args = ["--ro-bind", "/usr", "/usr"]
    for path in _TOP_LEVEL:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _OPTIONAL_FILES:
        args += ["--ro-bind-try", path, path]
    prefix = os.path.realpath(sys.base_prefix)
    binds = [prefix]
    if not _under(python, prefix):
        binds.append(os.path.dirname(python))
    for path in binds:
        if not any(_under(path, system) for system in ("/usr", *_TOP_LEVEL)):
            args += ["--ro-bind", path, path]
    return args


@dataclass(frozen=True)
class Setup:
    """Additions to a call's sandbox: bwrap arguments mounting more than the private ``/tmp``
    (a workspace), the directory to start in, runner settings and environment."""

    mounts: tuple[str, ...] = ()
    workdir: str = WORKDIR
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


class BwrapSandbox:
    name = "bwrap"

    def __init__(self, limits: SandboxLimits | None = None, bwrap: str | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.bwrap = bwrap or shutil.which("bwrap")
        self.python = interpreter()
        self._runner = runner_source()

    def command(self, request: ExecRequest, status_fd: int) -> list[str]:
        return self.command_with(request, status_fd, None)

    def command_with(self, request: ExecRequest, status_fd: int, setup: Setup | None) -> list[str]:
        """bwrap's argv for ``request``, with what ``setup`` adds (a workspace)."""
        if self.bwrap is None:
            raise SandboxUnavailable(
                "python_exec needs bubblewrap (the 'bwrap' command) to isolate code, and it is not installed "
                "on this worker: install the bubblewrap package (make does it where it runs as root), or point "
                "AGENTQ_SANDBOX at the sandbox Lambda function"
            )
        limits = self.limits
        setup = setup or Setup()
        config = {
            "cpu_seconds": math.ceil(request.timeout_seconds) + 1,
            "memory_bytes": request.memory_mb * 1024 * 1024,
            "max_file_bytes": limits.max_file_bytes,
            "max_open_files": limits.max_open_files,
            "max_code_bytes": limits.max_code_bytes,
            "expect_namespaces": True,
            **setup.config,
        }
        env: list[str] = []
        for key, value in {**SANDBOX_ENV, **setup.env}.items():
            env += ["--setenv", key, value]
        return [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",  # --unshare-all only tries it; here it is required
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--cap-drop", "ALL",
            "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_UID),
            "--hostname", "sandbox",
            "--clearenv", *env,
            *filesystem_args(self.python),
            "--proc", "/proc",
            "--remount-ro", "/proc",  # no process's memory written through /proc/<pid>/mem (bwrap's init)
            "--dev", "/dev",
            "--remount-ro", "/dev",
            "--size", str(limits.max_disk_bytes),
            "--tmpfs", WORKDIR,
            *setup.mounts,
            "--chdir", setup.workdir,
            "--remount-ro", "/",
            "--json-status-fd", str(status_fd),
            "--",
            self.python, "-I", "-S", "-B", "-u", "-c", self._runner, json.dumps(config),
        ]  # fmt: skip

    def run(
        self, request: ExecRequest, setup: Setup | None = None, *, halt: threading.Event | None = None
    ) -> ExecResult:
        """Run ``request`` (``setup``: what a workspace adds: its directory bound in, the
        runner's mode; see ``sandbox.workspace``); ``halt``: kill it once set (``supervise``)."""
        code = request.code.encode("utf-8")
        if len(code) > self.limits.max_code_bytes:
            raise ValueError(
                f"the script is {len(code)} bytes; the sandbox accepts at most {self.limits.max_code_bytes}"
            )
        read_end, write_end = os.pipe()
        open_fds = {read_end, write_end}

        def close(fd: int) -> None:
            # Each end is closed exactly once: a second close could hit a descriptor that
            # another thread of the worker has been given the same number since.
            if fd in open_fds:
                open_fds.discard(fd)
                os.close(fd)

        owner = outside_owner()
        env = {"PATH": SANDBOX_ENV["PATH"]}  # bwrap's own environment is visible as /proc/1/environ
        try:
            argv = self.command(request, write_end) if setup is None else self.command_with(request, write_end, setup)
            if owner is not None:
                if not os.path.isfile(argv[0]) or not os.access(argv[0], os.X_OK):
                    raise SandboxUnavailable(f"cannot start bubblewrap: {argv[0]} is not an executable file")
                try:
                    argv = stage.command(self.python, argv, *owner, env)
                except ValueError as exc:
                    raise SandboxUnavailable(f"cannot stage bubblewrap's command line: {exc}") from None
            status = _StatusReader(read_end, self.limits.max_disk_bytes)
            open_fds.discard(read_end)  # the reader closes it
            status.start()
            try:
                result = supervise(
                    argv,
                    code=code,
                    timeout=request.timeout_seconds,
                    limits=self.limits,
                    isolation=self.name,
                    usage_path=status.usage_path,
                    on_started=lambda _: close(write_end),
                    pass_fds=(write_end,),
                    env=env,
                    cwd="/",
                    pipe_owner=owner,
                    halt=halt,
                )
            except FileNotFoundError as exc:
                raise SandboxUnavailable(f"cannot start bubblewrap: {exc}") from None
            finally:
                close(write_end)
                status.join(timeout=2)
        finally:
            for fd in list(open_fds):
                close(fd)
        if status.child_pid is None and result.limit == "halted":
            return result  # killed before bwrap said its pid: --die-with-parent ends whatever it started
        if status.child_pid is None:
            message = result.stderr.strip() or f"bwrap exited with {result.exit_code}"
            if owner is not None:
                message += _as_owner(owner)
            raise SandboxUnavailable(f"bubblewrap could not set up the sandbox, so nothing ran: {message}")
        _wait_gone(status.child_pid)
        return result


def _as_owner(owner: tuple[int, int]) -> str:
    """Why a root worker's bwrap runs as ``owner``, and what of this host stands in its way."""
    refusals = userns_refusals()
    host = f"; this host refuses it: {'; '.join(refusals)}" if refusals else ""
    return (
        f" [the worker is root, so bubblewrap runs as uid {owner[0]}, gid {owner[1]}, which must be allowed to "
        f"create user namespaces: the sandbox must not be root outside its namespace, and is never run as root "
        f"instead{host}]"
    )


def _wait_gone(pid: int, seconds: float = 5.0) -> None:
    """Return once the sandbox's PID-namespace init has exited, which the kernel allows only
    after every process in the namespace is dead: nothing of the call outlives the call.

    Killing bwrap's own process group reaches the init only through --die-with-parent, a
    signal the kernel delivers asynchronously; and the init is not our child to wait for.
    """
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in (b"Z", b"X"):
            return
        if time.monotonic() > give_up - seconds / 2:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
    raise SandboxUnavailable(f"the sandbox (pid {pid}) did not go away after its run")


class _StatusReader(threading.Thread):
    """Reads bwrap's --json-status-fd: the sandbox's pid arrives once every namespace and
    mount is in place, so its absence at exit means bwrap gave up before running anything."""

    def __init__(self, fd: int, tmpfs_bytes: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.tmpfs_bytes = tmpfs_bytes
        self.child_pid: int | None = None
        self._ready = False

    def run(self) -> None:
        buffer = b""
        decoder = json.JSONDecoder()
        try:
            while chunk := os.read(self.fd, 4096):
                buffer += chunk
                text = buffer.decode("utf-8", errors="replace").lstrip()
                while text:
                    try:
                        doc, end = decoder.raw_decode(text)
                    except ValueError:
                        break
                    if isinstance(doc, dict) and "child-pid" in doc:
                        self.child_pid = int(doc["child-pid"])
                    text = text[end:].lstrip()
                buffer = text.encode("utf-8")
        finally:
            os.close(self.fd)

    def usage_path(self) -> str | None:
        """The sandbox's /tmp as seen from here, once it is mounted.

        bwrap reports the pid right after clone(), before the sandbox's mounts exist; until
        then the path leads to the host's /tmp. It counts only once it is a filesystem of
        exactly the tmpfs's size on another device than the host's.
        """
        if self.child_pid is None:
            return None
        path = f"/proc/{self.child_pid}/root{WORKDIR}"
        if not self._ready:
            try:
                st = os.statvfs(path)
                ours = os.stat(path).st_dev not in (os.stat("/").st_dev, os.stat(WORKDIR).st_dev)
            except OSError:
                return None
            self._ready = ours and st.f_blocks * st.f_frsize == self.tmpfs_bytes
        return path if self._ready else None
