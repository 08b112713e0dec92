"""The seam between ``python_exec`` and whatever isolates the code it runs.

A ``CodeSandbox`` takes a script and limits and returns what happened; how the code is kept
away from the worker (bubblewrap namespaces on a host, a separate Lambda function in AWS) is
the implementation's business. The one rule every implementation keeps: when it cannot set
up its isolation it raises ``SandboxUnavailable`` with the reason, and runs nothing. There is
no fallback to running the code less isolated, because a fallback is exactly the silent
downgrade an attacker would aim for.

This module is a leaf (standard library only), so the sandbox Lambda function can import it
without the rest of agentq or its third-party dependencies.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

# What the runner exits with when it could not set up the sandbox from the inside (seccomp
# filter refused, a namespace missing): the code did not run.
SETUP_FAILED_EXIT = 121
SETUP_FAILED_MARK = "agentq-sandbox-setup-failed: "
# What a run killed because its task no longer runs here (``limit`` "halted") is told: nothing it
# did will be kept, and no step follows on this worker.
HALTED = "killed: its task was stopped, cancelled or taken over while it ran; every process of it was killed"


class SandboxUnavailable(RuntimeError):
    """Isolation could not be set up, so the code was not run. The message says why."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits. Every one is enforced outside the code's reach (rlimits the code
    cannot raise, a size-capped filesystem, a supervisor that kills), none by asking nicely."""

    max_output_bytes: int = 32 * 1024  # per stream, kept; the rest is counted and dropped
    max_file_bytes: int = 16 * 1024 * 1024  # RLIMIT_FSIZE: one file
    max_disk_bytes: int = 64 * 1024 * 1024  # the whole working filesystem
    max_files: int = 2048  # files and directories the call may create
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_code_bytes: int = 256 * 1024

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxLimits:
        known = {k: int(v) for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class ExecRequest:
    code: str
    timeout_seconds: float
    memory_mb: int

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "timeout_seconds": self.timeout_seconds, "memory_mb": self.memory_mb}


@dataclass(frozen=True)
class ExecResult:
    """What a run produced. ``limit`` names the limit that ended it, if one did."""

    exit_code: int
    stdout: str
    stderr: str
    stdout_bytes: int = 0  # how many the code wrote, kept or not
    stderr_bytes: int = 0
    timed_out: bool = False
    limit: str | None = None  # "files" | "disk" | "halted" (its task stopped): why the supervisor killed it
    duration_ms: int = 0
    isolation: str = ""  # which sandbox ran it ("bwrap", "lambda", ...), for the trace
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExecResult:
        return cls(
            exit_code=int(data["exit_code"]),
            stdout=str(data["stdout"]),
            stderr=str(data["stderr"]),
            stdout_bytes=int(data.get("stdout_bytes", 0)),
            stderr_bytes=int(data.get("stderr_bytes", 0)),
            timed_out=bool(data.get("timed_out", False)),
            limit=data.get("limit"),
            duration_ms=int(data.get("duration_ms", 0)),
            isolation=str(data.get("isolation", "")),
            notes=tuple(str(n) for n in data.get("notes", ())),
        )

    def explain(self, timeout: float, memory_mb: int, limits: SandboxLimits) -> str:
        """Say which limit ended the run: "exit code -9" alone would leave the model guessing."""
        code = self.exit_code
        if self.timed_out:
            return f"timed out after {timeout:.1f}s of wall-clock time; the process was killed"
        if self.limit == "files":
            return f"killed: created more than {limits.max_files} files and directories"
        if self.limit == "disk":
            return f"killed: wrote more than {limits.max_disk_bytes // (1024 * 1024)} MB to disk"
        if self.limit == "halted":
            return HALTED
        if code == -signal.SIGXCPU:
            return "killed: CPU time limit exceeded"
        if code == -signal.SIGXFSZ:
            return f"killed: a file grew past {limits.max_file_bytes // (1024 * 1024)} MB"
        if code != 0 and ("MemoryError" in self.stderr or "Cannot allocate memory" in self.stderr):
            return f"memory limit of {memory_mb} MB exceeded"
        if code == -signal.SIGKILL:
            return f"killed (most likely the memory limit of {memory_mb} MB)"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return ""


@runtime_checkable
class CodeSandbox(Protocol):
    """Runs model-written Python where it cannot reach the worker, its credentials, other
    calls or the network. ``run`` raises ``SandboxUnavailable`` rather than run unisolated."""

    name: str

    def run(self, request: ExecRequest) -> ExecResult: ...


class RefusingSandbox:
    """The sandbox of a deployment that turned code execution off, or whose configuration
    is unusable: every call is refused with the reason, nothing runs."""

    name = "off"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def run(self, request: ExecRequest) -> ExecResult:
        raise SandboxUnavailable(self.reason)
