"""A task's workspace as durable state: a manifest of its files, scanned and restored.

The workspace lives on the worker's disk while a run holds the task (``core.engine._workspace``),
and in the bucket between runs: every regular file's content once, under its SHA-256
(content-addressed, so content shared between steps or files is stored once and a step uploads
only what no earlier manifest holds), and a manifest per state, also under its own hash. A step
that changed the workspace records the manifest's hash; a run that takes the task over restores
exactly that manifest and checks the result against it before any tool runs.

A manifest lists directories, regular files (mode, size, content hash) and symbolic links (their
target, never followed), sorted by path. Not kept: FIFOs, sockets and device files (the sandbox
cannot create devices; a FIFO or socket is gone after a resume), owners, timestamps, and set-id
bits; hard links come back as separate files with the same content. Everything on the worker's
side is read and written without following a link (``O_NOFOLLOW``, ``lstat``), and only after
every process of the tool call is dead, so nothing races the scan.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentq.core.errors import AgentqError
from agentq.core.tools.fetch import HostRule

Kind = Literal["d", "f", "l"]
MANIFEST_VERSION = 1


class WorkspaceRef(BaseModel):
    """What a step (and META) records of the workspace it left: the manifest's hash and size."""

    manifest: str
    files: int = 0
    bytes: int = 0
    uploaded_bytes: int = 0  # new content this step stored (the bench's "bytes uploaded")


# The tools that work in a task's workspace; a task that may use one of them has a workspace.
WORKSPACE_TOOLS = ("shell", "read_file", "write_file", "edit_file", "list_files", "search_files")
MAX_SEED_BYTES = 5 * 1024 * 1024  # inline starting files (a request body's share; API Gateway takes 10 MB)
MAX_SEED_FILES = 10_000


class SeedFile(BaseModel):
    """One starting file of a workspace (``agentq submit --workspace DIR`` sends a directory so)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=1024, description="relative to the workspace root, no '..'")
    content_b64: str = Field(description="the file's bytes, base64")
    mode: int = Field(strict=True, default=0o644, ge=0, le=0o777, description="permission bits")

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        _check_path(path)
        return path

    def data(self) -> bytes:
        import base64
        import binascii

        try:
            return base64.b64decode(self.content_b64, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"content_b64 of {self.path!r}: not base64 ({exc})") from None


class WorkspaceSpec(BaseModel):
    """A task's workspace as submitted: its starting files and the hosts its shell may reach."""

    model_config = ConfigDict(extra="forbid")

    files: list[SeedFile] = Field(default_factory=list, max_length=MAX_SEED_FILES)
    allow_hosts: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(
        default_factory=list,
        max_length=32,
        description="hosts (`host` or `host:port`) the shell may reach through the worker's egress proxy, each "
        "still checked by the SSRF guard (public addresses only, unless the deployment allows an internal one)",
    )

    @field_validator("allow_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            HostRule.parse(host)  # its ValueError names the bad entry
        return hosts

    @model_validator(mode="after")
    def _fits(self) -> WorkspaceSpec:
        total = 0
        seen: set[str] = set()
        for f in self.files:
            if f.path in seen:
                raise ValueError(f"files: {f.path!r} appears twice")
            seen.add(f.path)
            total += len(f.data())
        if total > MAX_SEED_BYTES:
            raise ValueError(f"files: {total} bytes, over the {MAX_SEED_BYTES} a submission may carry")
        for f in self.files:
            for parent in _parents(f.path):
                if parent in seen:
                    raise ValueError(f"files: {parent!r} is a file and a directory of {f.path!r}")
        return self

    def seed(self) -> tuple[Manifest, dict[str, bytes]]:
        """The starting state as a manifest and its content."""
        blobs: dict[str, bytes] = {}
        entries: dict[str, Entry] = {}
        for f in self.files:
            data = f.data()
            digest = hashlib.sha256(data).hexdigest()
            blobs[digest] = data
            for parent in _parents(f.path):
                entries.setdefault(parent, Entry(parent, "d", 0o755))
            entries[f.path] = Entry(f.path, "f", f.mode, len(data), digest)
        return Manifest(tuple(sorted(entries.values()))), blobs


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def has_workspace(spec: WorkspaceSpec | None, tools: list[str]) -> bool:
    return spec is not None or any(t in WORKSPACE_TOOLS for t in tools)


class WorkspaceRestoreFailed(AgentqError, ValueError):
    """The workspace of the last committed step could not be restored exactly: the task fails
    with this code rather than run on a half-restored disk (a deterministic fault)."""

    code = "workspace_restore_failed"


class WorkspaceTooLarge(AgentqError):
    """The workspace passed the task's file-count or byte limit."""

    code = "workspace_limit"


@dataclass(frozen=True)
class WorkspaceQuota:
    """Per-task totals (defaults: cdk.json's ``workspace_max_bytes`` and ``workspace_max_files``)."""

    max_bytes: int = 1024 * 1024 * 1024
    max_files: int = 100_000


@dataclass(frozen=True, order=True)
class Entry:
    path: str  # relative, "/"-separated, never "." or ".."-containing
    kind: Kind
    mode: int  # permission bits (0o777)
    size: int = 0
    digest: str = ""  # a file's SHA-256; a link's target


@dataclass(frozen=True)
class Manifest:
    entries: tuple[Entry, ...] = ()

    def to_bytes(self) -> bytes:
        rows = [[e.path, e.kind, e.mode, e.size, e.digest] for e in self.entries]
        return json.dumps({"v": MANIFEST_VERSION, "entries": rows}, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @property
    def files(self) -> int:
        return sum(1 for e in self.entries if e.kind == "f")

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == "f")

    def blobs(self) -> set[str]:
        return {e.digest for e in self.entries if e.kind == "f"}

    def by_path(self) -> dict[str, Entry]:
        return {e.path: e for e in self.entries}

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        doc = json.loads(data)
        if doc.get("v") != MANIFEST_VERSION:
            raise ValueError(f"unknown workspace manifest version {doc.get('v')!r}")
        entries = []
        for path, kind, mode, size, digest in doc["entries"]:
            _check_path(str(path))
            if kind not in ("d", "f", "l"):
                raise ValueError(f"unknown entry kind {kind!r} for {path!r}")
            entries.append(Entry(str(path), kind, int(mode) & 0o777, int(size), str(digest)))
        return cls(tuple(sorted(entries)))


def _check_path(path: str) -> None:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
        raise ValueError(f"not a relative workspace path: {path!r}")


EMPTY = Manifest()

# What a scan remembers of a file it hashed, so the next scan hashes only what changed: size,
# mtime, ctime (which no one can set back) and inode.
Signature = tuple[int, int, int, int]


@dataclass
class ScanCache:
    known: dict[str, tuple[Signature, str]] = field(default_factory=dict)


def _hash_file(path: Path) -> tuple[str, int]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        h = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
            size += len(chunk)
        return h.hexdigest(), size
    finally:
        os.close(fd)


def scan(root: Path, cache: ScanCache | None = None, quota: WorkspaceQuota | None = None) -> Manifest:
    """The manifest of ``root`` as it is now (``cache``: files whose signature did not change
    are not read again). Over ``quota`` raises ``WorkspaceTooLarge``."""
    cache = cache if cache is not None else ScanCache()
    entries: list[Entry] = []
    seen: dict[str, tuple[Signature, str]] = {}
    total = files = 0

    def walk(directory: Path, prefix: str) -> None:
        nonlocal total, files
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda e: e.name)
        for child in children:
            rel = f"{prefix}{child.name}"
            st = child.stat(follow_symlinks=False)
            mode = stat.S_IMODE(st.st_mode) & 0o777
            if stat.S_ISLNK(st.st_mode):
                entries.append(Entry(rel, "l", 0o777, 0, os.readlink(child.path)))
            elif stat.S_ISDIR(st.st_mode):
                entries.append(Entry(rel, "d", mode))
                walk(Path(child.path), rel + "/")
            elif stat.S_ISREG(st.st_mode):
                files += 1
                total += st.st_size
                if quota is not None and (files > quota.max_files or total > quota.max_bytes):
                    raise WorkspaceTooLarge(
                        f"the workspace holds more than its limit of {quota.max_files} files or {quota.max_bytes} bytes"
                    )
                sig = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                known = cache.known.get(rel)
                if known is not None and known[0] == sig:
                    digest, size = known[1], st.st_size
                else:
                    digest, size = _hash_file(Path(child.path))
                seen[rel] = (sig, digest)
                entries.append(Entry(rel, "f", mode, size, digest))
            # FIFOs, sockets, devices: not part of the workspace's durable state

    walk(root, "")
    cache.known = seen
    return Manifest(tuple(sorted(entries)))


def content_of(root: Path, entry: Entry) -> bytes:
    """A scanned file's bytes, read without following a link."""
    fd = os.open(root / entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def wipe(root: Path) -> None:
    """Remove ``root`` and everything under it (a directory the agent made unwritable too)."""
    if not root.exists() and not root.is_symlink():
        return

    def writable_again(func: Callable[..., object], path: str, _exc: object) -> None:
        parent = os.path.dirname(path)
        os.chmod(parent, 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
        func(path)

    shutil.rmtree(root, onerror=writable_again)


def restore(root: Path, manifest: Manifest, fetch: Callable[[str], bytes], cache: ScanCache | None = None) -> None:
    """Make ``root`` exactly ``manifest`` (everything there before is removed), then check it.

    ``fetch(digest)`` returns a file's content; content whose hash differs, a missing object
    or a result that does not scan back to the manifest raises ``WorkspaceRestoreFailed``.
    """
    wipe(root)
    root.mkdir(parents=True, mode=0o700)
    dirs = [e for e in manifest.entries if e.kind == "d"]
    links = {e.path for e in manifest.entries if e.kind == "l"}
    for entry in dirs:
        (root / entry.path).mkdir(mode=0o700)
    for entry in manifest.entries:
        if entry.kind != "f":
            continue
        if any(entry.path.startswith(link + "/") for link in links):
            raise WorkspaceRestoreFailed(f"the manifest puts {entry.path!r} under a symbolic link")
        data = fetch(entry.digest)
        if hashlib.sha256(data).hexdigest() != entry.digest:
            raise WorkspaceRestoreFailed(f"the stored content of {entry.path!r} does not match its hash")
        fd = os.open(root / entry.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, entry.mode)
        finally:
            os.close(fd)
    for entry in manifest.entries:
        if entry.kind == "l":
            os.symlink(entry.digest, root / entry.path)
    for entry in sorted(dirs, key=lambda e: e.path.count("/"), reverse=True):
        os.chmod(root / entry.path, entry.mode)
    found = scan(root, cache)
    if found.digest != manifest.digest:
        raise WorkspaceRestoreFailed(
            f"the restored workspace does not match its manifest ({found.files} files, {found.total_bytes} bytes "
            f"restored; {manifest.files} files, {manifest.total_bytes} bytes expected)"
        )


def diff(old: Manifest, new: Manifest) -> dict[str, list[str]]:
    """Paths added, removed and changed (content, mode or link target) from ``old`` to ``new``."""
    before, after = old.by_path(), new.by_path()
    return {
        "added": sorted(p for p in after if p not in before),
        "removed": sorted(p for p in before if p not in after),
        "changed": sorted(p for p in after if p in before and after[p] != before[p]),
    }
