"""The workspace of the task a run holds: restored at the claim, checkpointed before the tools
step that changed it commits, removed when the run ends (``core.workspace`` says what is kept).

The order is the invariant (docs/ARCHITECTURE.md, the workspace invariant): the content a step
changed and its manifest are in the bucket *before* the step's commit names the manifest, so a
committed step never points at content that is not there; content a turn uploaded whose step
never committed is never named, and a takeover restores the last committed manifest, so the
files that turn wrote are gone. A restore that cannot reproduce the manifest exactly fails the
task (``workspace_restore_failed``) instead of running on a half-restored disk; one an outage cut
short (the bucket, the worker's disk: ``core.workspace_restore``) raises it, and the run gives its
lease back for the redelivery.

A workspace that starts from a git repository is cloned at the first claim
(``_workspace_clone``), its content and manifest stored, then recorded on META once (fenced:
``start_workspace``) before any step runs: step 0's files, which later claims restore rather than
clone. A task with committed steps and no recorded start is never cloned (its files would appear at
a step its history ran without them): it fails ``workspace_start_refused``, as does a clone whose
record is refused for anything but a lost lease. One that starts from stored content (an uploaded archive, a parent's workspace) restores
it from where it is (``lookup``); it is never copied under the task's prefix.

Each claim gets a directory of its own (``<root>/<worker>-<pid>/<task>.<random>``, made with
``mkdtemp``), and a run's end removes only that directory: two runs of one task on one host, in
one process or two (a zombie that lost its lease and the run that took the task over), never
share a directory, so neither sees, commits or removes the other's files. A process killed
mid-run (SIGKILL, OOM) removes nothing: the first directory a process makes sweeps the
``<worker>-<pid>`` directories of processes no longer alive (``sweep_dead``), so a host that
restarts its workers in place does not keep one dead workspace per kill. A live process's
directories are never touched, whoever it is. What a restore makes belongs to the uid the
sandbox is outside its namespace (65534 under a root worker: ``sandbox.bwrap.outside_owner``),
so the code may change the files it is given back.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentq.core.engine._session import Session
from agentq.core.engine._workspace_clone import clone
from agentq.core.models import Task
from agentq.core.pids import left_by_gone
from agentq.core.ports import WorkspaceStore
from agentq.core.workspace import (
    EMPTY,
    Manifest,
    WorkspaceQuota,
    WorkspaceRef,
    WorkspaceRefused,
    WorkspaceRestoreFailed,
    WorkspaceSourceFailed,
    WorkspaceStartRefused,
    WorkspaceStartTooLarge,
    WorkspaceTooLarge,
    has_workspace,
    lookup_of,
    stored_start,
)
from agentq.core.workspace_diff import changes
from agentq.core.workspace_disk import PARALLEL, ScanCache, open_verified, opened, row_bytes, scan, wipe
from agentq.core.workspace_restore import restore
from agentq.core.workspace_scrub import Scrub
from agentq.core.workspace_stream import each
from agentq.sandbox.base import ExecResult
from agentq.sandbox.bwrap import outside_owner
from agentq.sandbox.workspace import WorkspaceSandbox

log = logging.getLogger("agentq.engine")
ROOT_VARIABLE = "AGENTQ_WORKSPACE_ROOT"
CHILD_PATCH_CHARS = 16_000  # of a child's diff in the spawn result its parent's model reads


_PROCESS_DIRECTORY = re.compile(r"^.+-(\d+)$")  # <worker>-<pid>, as _directory names it


def sweep_dead(root: Path) -> list[Path]:
    """Remove the ``<worker>-<pid>`` directories under ``root`` whose process is gone
    (``core.pids``), and return them; a live process's, or a name not ours, is kept."""
    swept: list[Path] = []
    for name in left_by_gone(root, _PROCESS_DIRECTORY):
        try:
            wipe(root / name)
            swept.append(root / name)
        except OSError:
            log.warning("could not remove a dead worker's workspace directory %s", root / name, exc_info=True)
    return swept


def _unchanged(ws: TaskWorkspace, quota: WorkspaceQuota, scrub: Scrub | None, refused: WorkspaceTooLarge) -> Manifest:
    """The workspace's manifest if it is still the last step's, which was itself past ``quota``:
    scanned again under limits raised to what that state holds (so no more is read than is
    already there); ``refused`` otherwise (the turn passed the quota, or changed a state past it)."""
    committed = ws.committed
    held = WorkspaceQuota(
        max_bytes=max(quota.max_bytes, committed.total_bytes),
        max_files=max(quota.max_files, len(committed.entries)),
        max_manifest_bytes=max(quota.max_manifest_bytes, sum(row_bytes(e) for e in committed.entries)),
    )
    if held == quota:  # the last step's state fits: the turn passed the quota
        raise refused
    try:
        manifest = scan(ws.directory, ws.cache, held, scrub)
    except WorkspaceTooLarge:
        raise refused from None
    if manifest.digest != committed.digest:
        raise refused
    return manifest


def _scrub(s: Session) -> Scrub | None:
    """A run that opened a credential may have had a process read an API's echo of it and write
    it into the workspace: its scans scrub what they store (``core.workspace_scrub``)."""
    return Scrub() if s.credentials is not None and s.credentials.opened else None


def default_root() -> Path:
    return Path(os.environ.get(ROOT_VARIABLE) or Path(tempfile.gettempdir()) / "agentq-workspaces")


@dataclass
class TaskWorkspace:
    """A run's workspace, as its tools reach it (``core.tools.WorkspaceAccess``)."""

    task_id: str
    directory: Path
    committed: Manifest  # the state of the last committed step (or the seed)
    stored: set[str]  # content known to be in the bucket
    sandbox: WorkspaceSandbox
    egress: Any = None  # core.tools.egress.EgressProxy when the task allows hosts
    lookup: list[str] = field(default_factory=list)  # where content it did not store is (core.workspace.lookup_of)
    cache: ScanCache = field(default_factory=ScanCache)
    pending: Manifest | None = None  # checkpointed, its step not committed yet
    # The run's ``LeaseState.lost``: set when the task no longer runs under this worker's lease
    # (a stop's mark, a cancel, a takeover), and then the shell or python_exec running in the
    # workspace is killed at once, not left to its own limit (up to MAX_SHELL_SECONDS).
    halt: threading.Event | None = None

    def shell(self, command: str, timeout: float) -> ExecResult:
        egress = self.egress.path if self.egress else None
        return self.sandbox.shell(self.directory, command, timeout, egress=egress, halt=self.halt)

    def python(self, code: str, timeout: float, memory_mb: int) -> ExecResult:
        return self.sandbox.python(self.directory, code, timeout, memory_mb, halt=self.halt)

    def file_op(self, op: str, *, writable: bool, **args: Any) -> str:
        return self.sandbox.file_op(self.directory, op, writable=writable, **args)


class Workspaces:
    def __init__(
        self,
        store: WorkspaceStore,
        *,
        worker_id: str,
        root: str | None,
        quota: WorkspaceQuota,
        egress: Any = None,  # a task's allow_hosts -> its EgressProxy (core.tools.egress)
        record_start: Any = None,  # (lease, WorkspaceRef) -> None: TaskLeases.start_workspace
        credentials: Any = None,  # Session -> the task's CredentialSource, for the proxy to add (or None)
    ) -> None:
        self.store = store
        self.record_start = record_start
        self.quota = quota
        self.egress = egress
        self.credentials = credentials
        self._root = Path(root) if root else None
        self._worker = re.sub(r"[^A-Za-z0-9_.-]", "_", worker_id)[:100] or "worker"
        self._sandbox: WorkspaceSandbox | None = None

    def _directory(self, task_id: str) -> Path:
        """A new directory for this claim, no other run's (``mkdtemp``: a random name, 0700)."""
        root = self._root or default_root()
        base = root / f"{self._worker}-{os.getpid()}"
        if not base.exists():  # this process's first: the dead ones' go first
            sweep_dead(root)
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Path(tempfile.mkdtemp(prefix=f"{task_id}.", dir=base))

    def open(self, s: Session) -> None:
        """Restore the task's workspace as of its last committed step into this worker's
        directory for it (its starting files, before any step changed it)."""
        sub = s.task.submission
        if not has_workspace(sub.workspace, sub.constraints.tools):
            return
        if self._sandbox is None:
            self._sandbox = WorkspaceSandbox()
        directory = self._directory(s.task_id)
        ws = TaskWorkspace(s.task_id, directory, EMPTY, set(), self._sandbox, halt=s.held.lost)
        ws.lookup = lookup_of(sub.workspace, s.task.tenant)
        s.workspace = ws  # from here on, close() removes the directory whatever happens
        if sub.workspace is not None and sub.workspace.allow_hosts and self.egress is not None:
            source = self.credentials(s) if self.credentials is not None else None
            ws.egress = self.egress(sub.workspace.allow_hosts, credentials=source)
        if s.task.workspace is None and sub.workspace is not None and sub.workspace.git is not None:
            if s.task.step > 0:  # a clone is step 0's files, recorded before any step: never later
                raise WorkspaceStartRefused(
                    f"task {s.task_id}: workspace.git: the task has {s.task.step} committed steps and no "
                    "recorded start; its repository can only be its starting files"
                )
            self._clone(ws, s)
            return
        self._restore(ws, s.task.workspace, s)

    def _clone(self, ws: TaskWorkspace, s: Session) -> None:
        """Step 0's files from the task's repository, stored and recorded before any step runs."""
        spec = s.task.submission.workspace
        assert spec is not None and spec.git is not None
        clone(ws.sandbox, ws.directory, spec.git, ws.egress)
        try:
            manifest = scan(ws.directory, ws.cache, self.quota.for_task(spec), _scrub(s))
        except WorkspaceTooLarge as exc:
            raise WorkspaceStartTooLarge(
                f"workspace.git: the repository {exc.message}", field="workspace.git"
            ) from None
        except WorkspaceRefused as exc:
            raise WorkspaceSourceFailed(f"workspace.git: the clone cannot be kept: {exc.message}") from None
        ref = self._store(ws, s, manifest)
        if self.record_start is not None:
            self.record_start(s.lease, ref)
        ws.committed, ws.pending = manifest, None
        s.task = s.task.model_copy(update={"workspace": ref, "workspace_start": ref})

    def _restore(self, ws: TaskWorkspace, ref: WorkspaceRef | None, s: Session) -> None:
        try:
            spec = s.task.submission.workspace
            start = stored_start(spec, s.task.tenant) if ref is None else None
            if ref is None and start is None:
                manifest, seed = spec.seed() if spec is not None else (EMPTY, {})
                stored: set[str] = set()
                restore(ws.directory, manifest, seed.__getitem__, ws.cache, outside_owner())
            else:
                digest_ = ref.manifest if ref is not None else start.manifest  # type: ignore[union-attr]
                manifest = Manifest.from_bytes(self.store.get_manifest(s.task_id, digest_, ws.lookup))
                if manifest.digest != digest_:
                    raise WorkspaceRestoreFailed(f"the stored manifest {digest_} does not match its hash")
                fetch = lambda digest: self.store.open_blob(s.task_id, digest, ws.lookup)  # noqa: E731
                restore(ws.directory, manifest, fetch, ws.cache, outside_owner())
                stored = manifest.blobs()
        except WorkspaceRestoreFailed as exc:
            raise WorkspaceRestoreFailed(f"task {s.task_id}: {exc.message}") from exc
        except (LookupError, ValueError) as exc:
            raise WorkspaceRestoreFailed(
                f"task {s.task_id}: the workspace of step {s.task.step} could not be restored: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        ws.committed, ws.stored, ws.pending = manifest, stored, None

    def checkpoint(self, s: Session) -> WorkspaceRef | None:
        """Store what the turn changed, before its step commits: the new content, then the
        manifest; the ref for the step (None: the workspace is as the last step left it).
        Over the task's quota, unreadable, or holding a credential's value where it cannot be
        redacted, raises ``WorkspaceRefused`` (the caller reverts the turn). A workspace the
        turn left as it was is never refused for its size: a start past the quota (a deployment
        whose limit was lowered after the task was accepted) would else refuse every turn, a
        read-only one too."""
        ws: TaskWorkspace | None = s.workspace
        if ws is None:
            return None
        quota = self.quota.for_task(s.task.submission.workspace)
        try:
            manifest = scan(ws.directory, ws.cache, quota, _scrub(s))
        except WorkspaceTooLarge as refused:
            manifest = _unchanged(ws, quota, _scrub(s), refused)
        if manifest.digest == ws.committed.digest and ws.stored >= manifest.blobs():
            return None
        ref = self._store(ws, s, manifest)
        ws.pending = manifest
        return ref

    def _store(self, ws: TaskWorkspace, s: Session, manifest: Manifest) -> WorkspaceRef:
        """The content of ``manifest`` not stored yet, then the manifest itself; its ref."""
        new = list({e.digest: e for e in manifest.entries if e.kind == "f" and e.digest not in ws.stored}.values())
        uploaded = 0
        scrub = _scrub(s)
        shown = scrub.shown if scrub is not None else str  # how a refusal names a file
        # PARALLEL files at a time, each streamed a chunk at a time (``core.workspace_stream``: a
        # sparse file's apparent size is never in memory) and checked against the hash the
        # manifest records before its last byte is sent; stored create-only under that hash.
        with opened(ws.directory) as cursor, ThreadPoolExecutor(PARALLEL) as pool:
            for start in range(0, len(new), PARALLEL):
                window = new[start : start + PARALLEL]
                with ExitStack() as files:
                    streams = [files.enter_context(open_verified(cursor, e, shown)) for e in window]
                    written = each(pool, lambda f: self.store.put_blob(s.task_id, f.entry.digest, f), streams)
                uploaded += sum(e.size for e, new_object in zip(window, written, strict=True) if new_object)
                ws.stored |= {e.digest for e in window}
        self.store.put_manifest(s.task_id, manifest.digest, manifest.to_bytes())
        return WorkspaceRef(
            manifest=manifest.digest, files=manifest.files, bytes=manifest.total_bytes, uploaded_bytes=uploaded
        )

    def child_changes(self, child: Task) -> dict[str, Any] | None:
        """What a child that started from its parent's workspace changed in it, for the spawn's
        result: the paths added, removed and changed, and a unified diff of the text files, cut
        at ``CHILD_PATCH_CHARS``. None for a child that did not start from it; a note when its
        content cannot be read (the result must not fail the parent's turn).

        Only a ``workspace: "parent"`` child has a spec (``core.fanout.parent_workspace``), and
        it names a stored base only when the parent had one at the spawn. A parent that had not
        changed a file yet passes its own start: none (an empty spec), inline ``files``, or (not
        recorded yet) its repository. What the child changed is then measured from that start,
        the seed's manifest or the clone the child recorded (``workspace_start``), never dropped."""
        spec = child.submission.workspace
        if spec is None:
            return None
        lookup = lookup_of(spec, child.tenant)

        def read(digest: str) -> bytes:
            return self.store.get_blob(child.task_id, digest, lookup)

        try:
            read_base = read
            start = child.workspace_start  # a clone's start (its step 0), stored like any step's
            stored = spec.base.manifest if spec.base is not None else start.manifest if start is not None else None
            if stored is not None:
                base = Manifest.from_bytes(self.store.get_manifest(child.task_id, stored, lookup))
            else:  # inline files or none: in the submission, not in the bucket
                base, seed = spec.seed()
                read_base = lambda digest: seed[digest] if digest in seed else read(digest)  # noqa: E731
            end = child.workspace
            final = (
                base
                if end is None
                else Manifest.from_bytes(self.store.get_manifest(child.task_id, end.manifest, lookup))
            )
            found = changes(base, read_base, final, read, CHILD_PATCH_CHARS)
        except (LookupError, ValueError) as exc:
            return {"error": f"its workspace could not be read: {type(exc).__name__}: {exc}"}
        return {
            "added": found.added,
            "removed": found.removed,
            "changed": found.changed,
            "patch": found.patch,
            "truncated": found.truncated,
        }

    def committed(self, s: Session) -> None:
        """The step naming the checkpoint committed: it is the state a takeover restores."""
        ws: TaskWorkspace | None = s.workspace
        if ws is not None and ws.pending is not None:
            ws.committed, ws.pending = ws.pending, None

    def revert(self, s: Session) -> None:
        """Put the workspace back as the last committed step left it (a turn over the quota)."""
        ws: TaskWorkspace | None = s.workspace
        if ws is not None:
            self._restore(ws, s.task.workspace, s)

    def close(self, s: Session) -> None:
        ws: TaskWorkspace | None = s.workspace
        if ws is None:
            return
        s.workspace = None
        try:  # only this claim's directory; nothing may escape the run's finally
            if ws.egress is not None:
                ws.egress.close()
            wipe(ws.directory)
        except Exception:
            log.warning("could not remove the workspace directory %s", ws.directory, exc_info=True)
