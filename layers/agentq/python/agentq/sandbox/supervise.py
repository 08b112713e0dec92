"""Watching one sandboxed run from the outside: its output, its clock and its disk.

Shared by the bubblewrap sandbox and the sandbox Lambda function. The supervisor keeps the
first ``max_output_bytes`` of each stream (and keeps reading, so a chatty run never blocks
on a full pipe), kills the run's process group at the wall-clock timeout, or as soon as the
caller says the run's purpose is gone (``halt``: its task was stopped), and polls the
filesystem the run writes to: over ``max_files`` inodes or ``max_disk_bytes`` and the run is
killed. The poll is ``statvfs`` of that filesystem, one system call that walks nothing the
code could have booby-trapped; the code can overshoot the limit by what it writes in one
poll interval, no more.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from agentq.sandbox.base import SETUP_FAILED_EXIT, SETUP_FAILED_MARK, ExecResult, SandboxLimits, SandboxUnavailable

POLL_SECONDS = 0.05


class Drain(threading.Thread):
    """Reads a pipe to its end, keeping only the first ``limit`` bytes."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.limit = limit
        self.kept = bytearray()
        self.total = 0

    def run(self) -> None:
        try:
            while chunk := self.stream.read1(65536):  # type: ignore[attr-defined]
                self.total += len(chunk)
                room = self.limit - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]
        except (OSError, ValueError):
            pass

    def text(self, name: str) -> str:
        out = bytes(self.kept).decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            out += f"\n[{name} truncated: first {len(self.kept)} of {self.total} bytes shown]"
        return out


@dataclass(frozen=True)
class Usage:
    files: int
    bytes: int


def fs_usage(path: str) -> Usage:
    st = os.statvfs(path)
    return Usage(files=st.f_files - st.f_ffree, bytes=(st.f_blocks - st.f_bfree) * st.f_frsize)


def _feed(stream: IO[bytes], data: bytes) -> None:
    try:
        stream.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass  # the runner refused before reading: its exit status says why
    finally:
        with contextlib.suppress(OSError):
            stream.close()


def _owned_pipes(owner: tuple[int, int]) -> list[tuple[int, int]]:
    """Two pipes (read end, write end) whose inode belongs to ``owner``. A worker that cannot
    give them (``EINVAL``: the uid is not mapped in the user namespace it runs in) keeps them:
    bwrap as that uid then fails to start anyway, and says why."""
    pipes = [os.pipe() for _ in range(2)]  # not inheritable: Popen dup2s the write ends onto 1 and 2
    for _, write in pipes:
        with contextlib.suppress(OSError):
            os.fchown(write, *owner)
    return pipes


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


def supervise(
    argv: list[str],
    *,
    code: bytes,
    timeout: float,
    limits: SandboxLimits,
    isolation: str,
    usage_path: Callable[[], str | None],
    baseline: Usage | None = None,
    on_started: Callable[[subprocess.Popen[bytes]], None] | None = None,
    pipe_owner: tuple[int, int] | None = None,
    halt: threading.Event | None = None,
    **popen: Any,
) -> ExecResult:
    """Run ``argv`` with ``code`` on its stdin and return its result.

    ``usage_path`` names the filesystem to poll once it exists (``None`` until then, e.g.
    until bubblewrap has reported the sandbox's pid); ``baseline`` is subtracted from what it
    reports, for a filesystem that is not empty when the run starts. ``pipe_owner``: the uid
    and gid the run is when that is not the worker's (``bwrap.outside_owner``), given its
    stdout and stderr pipes: ``> /dev/stdout`` reopens the pipe through ``/proc/self/fd``,
    which the kernel checks against the pipe's owner and mode (0600), as for any file.
    ``halt``: set when what the run is for is over (its task no longer runs under the worker's
    lease: stopped, cancelled, taken over, ``core.engine._session.LeaseState.lose``): the run's
    process group is killed at the next poll (``POLL_SECONDS``), its result's ``limit`` "halted".
    """
    started = time.monotonic()
    outputs = _owned_pipes(pipe_owner) if pipe_owner is not None else None
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=outputs[0][1] if outputs else subprocess.PIPE,
            stderr=outputs[1][1] if outputs else subprocess.PIPE,
            start_new_session=True,  # its own process group: the kill reaches everything in it
            **popen,
        )
    except BaseException:
        for fd in [fd for pair in outputs or () for fd in pair]:
            os.close(fd)
        raise
    if outputs:
        for (read, write), name in zip(outputs, ("stdout", "stderr"), strict=True):
            os.close(write)
            setattr(proc, name, os.fdopen(read, "rb"))
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err = Drain(proc.stdout, limits.max_output_bytes), Drain(proc.stderr, limits.max_output_bytes)
    out.start()
    err.start()
    threading.Thread(target=_feed, args=(proc.stdin, code), daemon=True).start()
    if on_started is not None:
        on_started(proc)

    timed_out = False
    limit: str | None = None
    deadline = started + timeout
    base = baseline or Usage(0, 0)
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if halt is not None and halt.is_set():
                limit = "halted"
                break
            path = usage_path()
            if path is not None:
                try:
                    used = fs_usage(path)
                except OSError:
                    used = None  # the sandbox is going away; its exit status tells the rest
                if used is not None and used.files - base.files > limits.max_files:
                    limit = "files"
                    break
                if used is not None and used.bytes - base.bytes > limits.max_disk_bytes:
                    limit = "disk"
                    break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=min(POLL_SECONDS, max(0.0, deadline - now)))
    finally:
        if proc.poll() is None:
            kill_group(proc)
        proc.wait()
        out.join(timeout=2)
        err.join(timeout=2)
        proc.stdout.close()
        proc.stderr.close()

    stderr = err.text("stderr")
    if proc.returncode == SETUP_FAILED_EXIT and SETUP_FAILED_MARK in stderr:
        reason = stderr.split(SETUP_FAILED_MARK, 1)[1].strip().splitlines()[0]
        raise SandboxUnavailable(f"the sandbox refused to start: {reason}")
    return ExecResult(
        exit_code=proc.returncode,
        stdout=out.text("stdout"),
        stderr=stderr,
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        timed_out=timed_out,
        limit=limit,
        duration_ms=int((time.monotonic() - started) * 1000),
        isolation=isolation,
    )
