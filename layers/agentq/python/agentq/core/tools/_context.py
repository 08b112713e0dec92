"""What a tool may know of the call it serves (``ToolContext``), and the task's resources a
tool reaches through it (notes, memory stores, the workspace, the user's credentials), each as
the narrow interface the engine supplies. Injected by ``ToolRegistry.execute``, never part of
a tool's schema: the model cannot name its way to any of them.
"""

from __future__ import annotations

import hashlib
import time
import typing
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentq.core.memory import MemoryDocument, MemorySearchHit, SearchView
from agentq.core.secrets import SecretSource
from agentq.sandbox.base import ExecResult

if typing.TYPE_CHECKING:
    from agentq.core.vault import CredentialSource


@runtime_checkable
class NoteStore(Protocol):
    """Per-task key-value notes; the engine supplies one backed by the store (and fences
    writes with the lease), tests supply a dict."""

    def read_note(self, key: str) -> str | None: ...

    def write_note(self, key: str, value: str) -> None: ...


@runtime_checkable
class MemoryAccess(Protocol):
    """The memory stores attached to a task (``core.memory``), as its tools see them: the
    engine supplies one (``core.engine._memory.TaskMemory``) that names the tenant, fences
    writes with the lease and records the step and call that wrote each version."""

    def documents_page(
        self, store: str, prefix: str, limit: int, after: str | None
    ) -> tuple[list[MemoryDocument], str | None]: ...

    def read(self, store: str, path: str) -> MemoryDocument: ...

    def write(
        self, store: str, path: str, content: str, expected_sha256: str | None
    ) -> tuple[MemoryDocument, bool]: ...

    def search(self, store: str, query: str, limit: int, view: SearchView) -> list[MemorySearchHit]: ...


@runtime_checkable
class WorkspaceAccess(Protocol):
    """The task's workspace as its tools reach it (``core.engine._workspace.TaskWorkspace``):
    every call runs in a sandbox with the workspace bound in (``sandbox.workspace``)."""

    def shell(self, command: str, timeout: float) -> ExecResult: ...

    def python(self, code: str, timeout: float, memory_mb: int) -> ExecResult: ...

    def file_op(self, op: str, *, writable: bool, **args: Any) -> str: ...


class DeadlineNear(Exception):
    """A tool that bounds itself by the task's deadline (``ToolContext.bound``) was not started:
    too little is left to run it and still kill what it would start before the deadline. The
    registry reports it as the call's timeout."""


def idempotency_key_for(task_id: str, tool_use_id: str) -> str:
    """The key a side-effecting tool passes to the outside world (payment API, email sender...).

    It depends only on the task and the model's ``tool_use_id``, so when a worker dies after
    the effect but before committing the step, the retried call sends the same key and the
    remote side can deduplicate it. The engine passes a side-effecting call's effect record
    key, which is the id unless an earlier call of the task used it (``core.call_keys``).
    """
    return hashlib.sha256(f"{task_id}:{tool_use_id}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call it serves; injected, never part of the schema."""

    task_id: str
    tool_use_id: str
    idempotency_key: str  # stable for (task_id, tool_use_id): use idempotency_key_for()
    notes: NoteStore | None = None
    deadline: float | None = None  # time.time() by which the tool must end, if any
    secrets: SecretSource | None = None
    memory: MemoryAccess | None = None  # the task's attached memory stores, if any
    workspace: WorkspaceAccess | None = None  # the task's workspace, if it has one
    credentials: CredentialSource | None = None  # the vault of the task's user (core.vault)

    def credential(self, name: str) -> Any:
        """The task's user's credential ``name`` (else its tenant's) as a ``CredentialHandle``:
        a client that sends it to the hosts it is bound to and nowhere else; it never hands the
        value out. Missing: ``CredentialUnavailable`` (``credential_unavailable``), which the
        model reads, and may answer with ``request_credential``."""
        from agentq.core.tools.credentials import CredentialHandle
        from agentq.core.vault import unavailable

        if self.credentials is None:
            raise unavailable(name, None, None)
        return CredentialHandle(self.credentials.get(name), source=self.credentials)

    def secret(self, name: str) -> str:
        """A secret the deployment grants its tools (``core.secrets``): never from the task's
        input, so a model cannot name its way to one. Held by the redactor before the tool has
        it (``core.secrets.held``), whatever source the engine was given: what the tool returns,
        raises or logs with it, or an API's echo of it, is redacted."""
        from agentq.core.secrets import SecretUnavailable, held

        if self.secrets is None:
            raise SecretUnavailable("this worker has no secrets configured", field="secret")
        return held(name, self.secrets.get(name))

    @classmethod
    def create(
        cls,
        task_id: str,
        tool_use_id: str,
        *,
        notes: NoteStore | None = None,
        deadline: float | None = None,
        secrets: SecretSource | None = None,
        memory: MemoryAccess | None = None,
    ) -> ToolContext:
        """Build a context whose idempotency key cannot disagree with ``idempotency_key_for``."""
        return cls(
            task_id=task_id,
            tool_use_id=tool_use_id,
            idempotency_key=idempotency_key_for(task_id, tool_use_id),
            notes=notes,
            deadline=deadline,
            secrets=secrets,
            memory=memory,
        )

    def remaining(self) -> float | None:
        """Seconds left before the deadline, for tools that bound their own I/O by it."""
        return None if self.deadline is None else self.deadline - time.time()

    def bound(self, timeout: float, *, slack: float = 1.0, least: float = 0.5) -> float:
        """``timeout`` cut to end ``slack`` seconds before the deadline (the time to kill what
        the call started and report), for a tool that kills its processes at that bound (a
        sandboxed call). ``DeadlineNear`` when that leaves less than ``least``: a call that
        would run past the deadline is not started, rather than started and left running
        after the registry gave up on it (the engine would scan a workspace it still writes)."""
        remaining = self.remaining()
        if remaining is None:
            return timeout
        if remaining - slack < least:
            raise DeadlineNear(
                f"{max(0.0, remaining):.1f}s are left before the task's deadline; a sandboxed call needs at least "
                f"{slack + least:.1f}s to run and be killed before it"
            )
        return min(timeout, remaining - slack)
