"""A task's workspace as its tools reach it: one directory of the worker's disk, bound at
``/workspace`` into a bubblewrap sandbox for each call, and nothing else of the host writable.

Three kinds of call, each a sandbox of its own that ends with the call (its PID namespace dies
with it, so no process outlives the tool call that started it):

- ``shell``: ``bash -c`` in the workspace, under the runner's process-allowing filter
  (``runner.build_filter(processes=True)``): processes, yes; ptrace, namespaces, mounts, a
  socket family but Unix/IPv4/IPv6, no. Its network namespace holds only its own loopback;
  when the task allows hosts, ``127.0.0.1:3128`` inside leads to the worker's egress proxy
  (``core.tools.egress``), which applies the SSRF guard's rules to every destination.
- ``python``: python_exec's runner in the workspace (its strict filter: no process, no socket).
- ``file_op``: the file tools (``sandbox.fileops``) under that same strict filter, the
  workspace read-only for the tools that only read.

Which worker credentials, tables or buckets can the code reach? None: the environment is
cleared, the host's filesystem is not mounted but ``/usr`` and the interpreter read-only, and
another task's workspace is another directory that is never bound. Outside its namespace the
code is uid 65534 when the worker is root (``bwrap.outside_owner``; the worker's own uid
otherwise), so the directory is given to that uid before each call (``hand_over``), and what
the worker restores into it too (``core.workspace_restore``). What it does not bound: the
total a command writes during a call, and the memory of its processes together (``RLIMIT_AS``
is per process). See docs/SANDBOX.md.
"""

from __future__ import annotations

import errno
import json
import math
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentq.sandbox import fileops
from agentq.sandbox.base import ExecRequest, ExecResult, SandboxLimits, SandboxUnavailable
from agentq.sandbox.bwrap import BwrapSandbox, Setup, outside_owner

MOUNT = "/workspace"
EGRESS_SOCKET = "/run/agentq-egress.sock"
# Where the host keeps its public CA certificates and OpenSSL's configuration (Debian:
# /etc/ssl/certs, which /usr/lib/ssl links to; Amazon Linux: /etc/pki/tls/certs, whose bundle
# links into /etc/pki/ca-trust/extracted, and /etc/ssl/certs links to it). Bound read-only into
# a sandbox that may reach allowed hosts, so git, curl, pip and Python verify HTTPS through the
# proxy's CONNECT tunnels; a sandbox without network gets none (it could not use them). These
# paths and never their parents: /etc/ssl/private and /etc/pki/tls/private hold the host's own
# TLS keys, which the uid the code is outside its namespace may be allowed to read (a worker that
# is not root runs it as itself, and may be the one the keys are for).
CA_BUNDLES = (
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/pki/tls/certs",
    "/etc/pki/tls/openssl.cnf",
    "/etc/pki/ca-trust/extracted",
)
HOME = "/tmp"
SCRATCH = "/tmp/.agentq-run.py"  # the runner's copy of a script, off the workspace
DATA = "/tmp/.agentq-content"  # write_file's content, as the runner wrote it for the script
ANSWER_MARK = "\n{"


@dataclass(frozen=True)
class WorkspaceLimits:
    """Per-call limits of the workspace tools (the per-task totals are ``core.workspace``'s)."""

    max_file_bytes: int = 100 * 1024 * 1024  # RLIMIT_FSIZE in the shell; read/write limit of the file tools
    max_read_bytes: int = 2 * 1024 * 1024  # read_file/edit_file/search_files read at most this much of a file
    max_output_chars: int = 60_000  # read_file's text
    max_processes: int = 256  # RLIMIT_NPROC of the shell: the processes of its uid in its own user namespace
    shell_memory_mb: int = 2048  # RLIMIT_AS per process of the shell


def _sandbox(limits: SandboxLimits) -> BwrapSandbox:
    return BwrapSandbox(limits)


class WorkspaceSandbox:
    """Runs the workspace tools' calls for a directory of this host."""

    name = "bwrap-workspace"

    def __init__(self, limits: WorkspaceLimits | None = None, bwrap: str | None = None) -> None:
        self.limits = limits or WorkspaceLimits()
        base = SandboxLimits()
        self._shell = BwrapSandbox(
            replace(base, max_file_bytes=self.limits.max_file_bytes, max_code_bytes=256 * 1024), bwrap
        )
        self._python = BwrapSandbox(base, bwrap)
        # write_file's content follows the script on stdin (raw bytes, see file_op), and the
        # runner writes both to files: the file-size limit lets it.
        code_bytes = self.limits.max_file_bytes + 256 * 1024
        self._files = BwrapSandbox(
            replace(
                base,
                max_output_bytes=self.answer_bytes + 4096,
                max_code_bytes=code_bytes,
                max_file_bytes=max(base.max_file_bytes, code_bytes),
            ),
            bwrap,
        )
        self._fileops = Path(fileops.__file__).read_text(encoding="utf-8")

    @property
    def answer_bytes(self) -> int:
        """The most a file tool's answer may take (``fileops.fit`` cuts it to this)."""
        return 4 * self.limits.max_output_chars

    def _mounts(self, directory: Path, *, writable: bool = True, egress: str | None = None) -> tuple[str, ...]:
        if not directory.is_dir():
            raise SandboxUnavailable(f"the workspace directory {directory} is missing")
        hand_over(directory)
        mounts: tuple[str, ...] = ("--bind" if writable else "--ro-bind", str(directory), MOUNT)
        if egress is not None:
            mounts += ("--bind", egress, EGRESS_SOCKET)
            for path in CA_BUNDLES:  # public CA certificates, read-only: HTTPS through CONNECT verifies
                mounts += ("--ro-bind-try", path, path)
        return mounts

    def shell(
        self,
        directory: Path,
        command: str,
        timeout: float,
        *,
        egress: str | None = None,
        env: dict[str, str] | None = None,
        halt: threading.Event | None = None,
    ) -> ExecResult:
        """``bash -c command`` in the workspace; ``egress``: the host path of the egress proxy's
        socket when the task allows hosts (otherwise no network at all); ``halt``: every process
        of it is killed once set (its task stopped: ``supervise``)."""
        setup = Setup(
            mounts=self._mounts(directory, egress=egress),
            workdir=MOUNT,
            config={
                "mode": "shell",
                "max_processes": self.limits.max_processes,
                **({"proxy_socket": EGRESS_SOCKET} if egress else {}),
            },
            env={"HOME": HOME, "PWD": MOUNT, **(env or {})},
        )
        request = ExecRequest(code=command, timeout_seconds=timeout, memory_mb=self.limits.shell_memory_mb)
        return self._shell.run(request, setup, halt=halt)

    def python(
        self, directory: Path, code: str, timeout: float, memory_mb: int, *, halt: threading.Event | None = None
    ) -> ExecResult:
        """python_exec with the workspace as its working directory (``halt``: as ``shell``'s)."""
        setup = Setup(mounts=self._mounts(directory), workdir=MOUNT, config={"code_file": SCRATCH}, env={"HOME": HOME})
        request = ExecRequest(code=code, timeout_seconds=timeout, memory_mb=memory_mb)
        return self._python.run(request, setup, halt=halt)

    def file_op(self, directory: Path, op: str, *, writable: bool, timeout: float = 20.0, **args: Any) -> str:
        """One file tool's operation (``sandbox.fileops``); its refusal raises ``WorkspaceRefused``."""
        content = args.pop("content", None)
        data = ""
        if content is not None:
            try:
                size = len(str(content).encode("utf-8"))
            except UnicodeEncodeError:
                raise WorkspaceRefused("content: not valid Unicode (it holds a lone surrogate)") from None
            if size > self.limits.max_file_bytes:
                raise WorkspaceRefused(
                    f"content is {size} bytes, over the {self.limits.max_file_bytes}-byte limit for one file"
                )
            data, args["content_file"] = str(content), DATA
        request = {
            "op": op,
            "max_file_bytes": self.limits.max_read_bytes if op != "write" else self.limits.max_file_bytes,
            "max_output_chars": self.limits.max_output_chars,
            "max_answer_bytes": self.answer_bytes,
            **args,
        }
        literal = json.dumps(json.dumps(request, ensure_ascii=False), ensure_ascii=False)
        code = f"{self._fileops}\nmain({literal})\n"
        # write_file's content follows the script as raw UTF-8 bytes, which the runner writes to
        # DATA for the script to read, never compiled: only its size counts, not its escapes.
        config: dict[str, object] = {"code_file": SCRATCH}
        if data:
            config |= {"data_file": DATA, "data_bytes": len(data.encode("utf-8"))}
        setup = Setup(mounts=self._mounts(directory, writable=writable), workdir=MOUNT, config=config)
        memory = max(256, math.ceil(4 * self.limits.max_read_bytes / (1024 * 1024)) + 192)
        result = self._files.run(ExecRequest(code=code + data, timeout_seconds=timeout, memory_mb=memory), setup)
        if result.timed_out:
            raise WorkspaceRefused(f"the {op} operation timed out after {timeout:.1f}s")
        at = result.stdout.rfind(ANSWER_MARK)
        if result.exit_code != 0 or at < 0:
            raise WorkspaceRefused(f"the {op} operation failed: {result.stderr.strip()[-500:] or result.exit_code}")
        try:
            answer = json.loads(result.stdout[at + 1 :])
        except ValueError:
            raise WorkspaceRefused(f"the {op} operation's answer came back cut; ask for less") from None
        if "error" in answer:
            raise WorkspaceRefused(str(answer["error"]))
        return str(answer["ok"])


def hand_over(directory: Path) -> None:
    """Give the workspace directory itself to the uid the sandbox is outside its namespace, if
    that is not the worker (a root worker's: ``outside_owner``), so the code may write in it. What
    is in it is the sandbox's already, or was given to it when the worker restored it."""
    owner = outside_owner()
    if owner is None:
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != owner:
            os.fchown(fd, *owner)
    except OSError as exc:
        unmapped = " (not mapped in the user namespace this worker runs in)" if exc.errno == errno.EINVAL else ""
        raise SandboxUnavailable(
            f"cannot give the workspace directory to uid {owner[0]}{unmapped}, the uid its sandbox is outside "
            f"its user namespace when the worker is root: {exc.strerror}"
        ) from None
    finally:
        os.close(fd)


class WorkspaceRefused(ValueError):
    """A workspace tool refused its input (a path out of the workspace, a binary file read as
    text, a file over a limit): the model reads the reason as the tool's error."""


def check_host(bwrap: str | None = None, timeout: float = 20.0) -> None:
    """Run ``true`` in a workspace sandbox (``shell``'s namespaces, mounts and filter) in an empty
    directory, or raise ``SandboxUnavailable`` saying why not. A worker of the workspace pool does
    this before it claims anything (``agentq.worker``): on a host without user namespaces (Lambda,
    Fargate, a kernel that forbids them) it refuses to start instead of claiming tasks whose every
    tool call would fail."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="agentq-sandbox-check-") as directory:
        try:
            result = WorkspaceSandbox(bwrap=bwrap).shell(Path(directory), "true", timeout)
        except SandboxUnavailable:
            raise
        except OSError as exc:  # bwrap missing or not executable
            raise SandboxUnavailable(f"bubblewrap could not start: {exc}") from exc
        if result.exit_code != 0 or result.timed_out:
            detail = (result.stderr or result.stdout).strip()[-500:]
            raise SandboxUnavailable(f"a workspace sandbox could not run `true` (exit {result.exit_code}): {detail}")
