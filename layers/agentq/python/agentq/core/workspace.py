"""A task's workspace as durable state: its manifest, its starting files, its limits.

The workspace lives on the worker's disk while a run holds the task (``core.engine._workspace``),
and in the bucket between runs: every regular file's content once, under its SHA-256
(content-addressed, so content shared between steps or files is stored once and a step uploads
only what no earlier manifest holds), and a manifest per state, also under its own hash. A step
that changed the workspace records the manifest's hash; a run that takes the task over restores
exactly that manifest and checks the result against it before any tool runs.

A manifest lists directories, regular files (mode, size, content hash) and symbolic links (their
target, never followed), sorted by path. Not kept: FIFOs, sockets and device files (the sandbox
cannot create devices; a FIFO or socket is gone after a resume), owners, timestamps, and set-id
bits; hard links come back as separate files with the same content. The worker's side (the
scan, the restore, the removal, through directory descriptors, never following a link at any
component of a path) is ``core.workspace_disk``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentq.core.errors import AgentqError
from agentq.core.tools.fetch import HostRule

Kind = Literal["d", "f", "l"]
MANIFEST_VERSION = 1
MAX_DEPTH = 128  # directories below the root a workspace may nest (the scan holds one descriptor each)


def is_utf8(text: str) -> bool:
    """Whether ``text`` (a name, a link target) is what its bytes were, as UTF-8: Python reads
    other bytes (from the disk, from tarfile) as lone surrogates, which the manifest, the files
    API's JSON and every later scan cannot encode, so a workspace keeps text names only."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def escaped(text: str) -> str:
    """``text`` with the bytes that are not UTF-8 written ``\\xNN``: a message may name it."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no byte was read as (from the request itself)
        return text.encode("utf-8", "backslashreplace").decode()


class WorkspaceRef(BaseModel):
    """What a step (and META) records of the workspace it left: the manifest's hash and size."""

    manifest: str
    files: int = 0
    bytes: int = 0
    uploaded_bytes: int = 0  # new content this step stored (the bench's "bytes uploaded")


# The tools that work in a task's workspace; a task that may use one of them has a workspace.
WORKSPACE_TOOLS = ("shell", "read_file", "write_file", "edit_file", "list_files", "search_files")
# The tools whose sandbox reaches the task's allowed hosts (its egress proxy): a call of one of
# them that contacts a host is a side effect, recorded at most once (core.engine._tool_call).
# python_exec is not among them: in a workspace, as anywhere, its sandbox has no network.
NETWORK_TOOLS = ("shell",)
# Starting files travel inline in the submission, which is one DynamoDB item (400 KB) read with
# every claim: their base64 and paths may take this much of it, leaving room for a goal and a
# system prompt at their limits. Larger starting state: an archive uploaded first
# (``POST /workspace-uploads``: its content stored content-addressed, the submission names its
# manifest), or a git repository on an allowed host.
MAX_SEED_ENCODED_BYTES = 160 * 1024
MAX_SEED_FILES = 1_000
SHA256 = r"^[0-9a-f]{64}$"
# A git ref as a submission may name it: a branch, a tag or a commit id. Narrower than git's own
# rules (no '-' first, so it is never an option; no '..', '@{', '~', '^', ':', spaces or globs).
GIT_REF = r"^[A-Za-z0-9._/+-]{1,200}$"


class SeedFile(BaseModel):
    """One starting file of a workspace (``agentq submit --workspace DIR`` sends a directory so)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=1024, description="relative to the workspace root, no '..'")
    content_b64: str = Field(description="the file's bytes, base64")
    mode: int = Field(strict=True, default=0o644, ge=0, le=0o777, description="permission bits")

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        check_path(path)
        return path

    def data(self) -> bytes:
        import base64
        import binascii

        try:
            return base64.b64decode(self.content_b64, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"content_b64 of {self.path!r}: not base64 ({exc})") from None


class GitSource(BaseModel):
    """A workspace started from a git repository: cloned by the worker at the task's first claim,
    inside the workspace's sandbox, through the egress proxy (so only to a host the task allows,
    and only where the SSRF guard lets it), and recorded as the task's starting files."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=8,
        max_length=2048,
        description="http:// or https:// URL of the repository, on a host of allow_hosts; no credentials in it",
    )
    ref: str | None = Field(
        default=None,
        pattern=GIT_REF,
        description="a branch, tag or commit id to check out (default: the repository's default branch)",
    )

    @field_validator("ref")
    @classmethod
    def _ref(cls, ref: str | None) -> str | None:
        if ref is not None and (
            ref.startswith(("-", "/", ".")) or ref.endswith(("/", ".lock", ".")) or ".." in ref or "//" in ref
        ):
            raise ValueError(f"{ref!r} is not a branch, tag or commit id git accepts here")
        return ref

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        git_host(url)  # its ValueError says what is wrong with it
        return url

    def host(self) -> tuple[str, int]:
        return git_host(self.url)


def git_host(url: str) -> tuple[str, int]:
    """The host and port a clone of ``url`` contacts; ValueError for a URL the proxy cannot carry
    (another scheme: ssh and git:// do not pass an HTTP proxy) or that holds credentials (they
    would be stored with the task and shown wherever the submission is)."""
    import urllib.parse

    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ValueError("not a URL: it holds a space or a control character")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"scheme {parts.scheme or '(none)'!r}: only http:// and https:// repositories can be cloned")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials in the URL are refused (they would be stored with the task)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError("the port must be 1..65535") from None
    if not parts.hostname:
        raise ValueError("no host in the URL")
    return HostRule.parse(parts.hostname).host, port


class WorkspaceBase(BaseModel):
    """Starting state already in the bucket, named by its manifest: a sub-agent's parent's
    workspace as of the spawn (content shared, not copied). Set by the spawn, never sent.
    ``lookup``: where its content is, after the task's own prefix (``task:<id>``, ``upload:<tenant>``)."""

    model_config = ConfigDict(extra="forbid")

    manifest: str = Field(pattern=SHA256)
    lookup: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=64)


class WorkspaceSpec(BaseModel):
    """A task's workspace as submitted: where its starting files come from (at most one of inline
    ``files``, an uploaded archive's manifest, a git repository) and the hosts its shell may reach."""

    model_config = ConfigDict(extra="forbid")

    files: list[SeedFile] = Field(default_factory=list, max_length=MAX_SEED_FILES)
    max_bytes: int | None = Field(
        None,
        strict=True,
        ge=1,
        description="this task's limit on the bytes of its files, at most the deployment's "
        "(AGENTQ_WORKSPACE_MAX_BYTES); null: the deployment's",
    )
    max_files: int | None = Field(
        None,
        strict=True,
        ge=1,
        description="this task's limit on its entries (files, directories, links), at most "
        "the deployment's (AGENTQ_WORKSPACE_MAX_FILES); null: the deployment's",
    )
    upload: str | None = Field(
        default=None,
        pattern=SHA256,
        description="the `upload` a POST /workspace-uploads answered: the archive's files as starting files",
    )
    git: GitSource | None = Field(default=None, description="a repository to clone as the starting files")
    base: WorkspaceBase | None = Field(
        default=None, description="set by a spawn: the parent's workspace as of the spawn; not sent"
    )
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

    def sources(self) -> list[str]:
        """The starting sources it names (at most one is valid)."""
        return [
            name
            for name, given in (
                ("files", bool(self.files)),
                ("upload", self.upload is not None),
                ("git", self.git is not None),
                ("base", self.base is not None),
            )
            if given
        ]

    @model_validator(mode="after")
    def _fits(self) -> WorkspaceSpec:
        given = self.sources()
        if len(given) > 1:
            raise ValueError(
                f"{given[1]}: the starting files come from one source; {' and '.join(given)} were both given"
            )
        encoded = 0
        seen: set[str] = set()
        for f in self.files:
            if f.path in seen:
                raise ValueError(f"files: {f.path!r} appears twice")
            seen.add(f.path)
            f.data()  # its ValueError names a file that is not base64
            encoded += len(f.content_b64) + len(f.path.encode())
        if encoded > MAX_SEED_ENCODED_BYTES:
            raise ValueError(
                f"files: {encoded} bytes of base64 content and paths, over the {MAX_SEED_ENCODED_BYTES} a submission "
                "carries inline (it is stored in one DynamoDB item); start larger workspaces from a repository"
            )
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


def stored_start(spec: WorkspaceSpec | None, tenant: str) -> WorkspaceBase | None:
    """The starting state when it is already in the bucket (an upload, a parent's workspace):
    its manifest and where its content is. None: inline files, a clone, or empty."""
    if spec is None:
        return None
    if spec.upload is not None:
        return WorkspaceBase(manifest=spec.upload, lookup=[f"upload:{tenant}"])
    return spec.base


def lookup_of(spec: WorkspaceSpec | None, tenant: str) -> list[str]:
    """Where a task's workspace content may be besides its own prefix (its start's owners)."""
    start = stored_start(spec, tenant)
    return list(start.lookup) if start is not None else []


class WorkspaceRestoreFailed(AgentqError, ValueError):
    """The workspace of the last committed step could not be restored exactly: the task fails
    with this code rather than run on a half-restored disk (a deterministic fault)."""

    code = "workspace_restore_failed"


class WorkspaceRefused(AgentqError):
    """A turn left the workspace in a state that is not checkpointed: the turn's changes are
    undone (the last committed step's workspace restored) and its last workspace call reports
    this as its error, which the model reads (``core.engine._tool_turn``)."""

    code = "workspace_refused"


class WorkspaceSourceFailed(AgentqError, ValueError):
    """The starting files could not be made (a clone refused by the proxy, a repository that is
    not there, a ref it does not have): the task fails with the code, no step runs, and nothing
    of the half-made workspace is recorded (a deterministic fault)."""

    code = "workspace_git_failed"


class WorkspaceRefNotFound(WorkspaceSourceFailed):
    code = "workspace_git_ref_not_found"


class WorkspaceStartRefused(WorkspaceSourceFailed):
    """A repository start that is not step 0's: the task has committed steps and no start is
    recorded (a task that ran without it, then given it), or the fenced record of the clone was
    refused for that reason (``TaskLeases.start_workspace``). Cloned now, its files would appear
    at a step its history ran without them, on every claim again; the task fails instead."""

    code = "workspace_start_refused"


class WorkspaceStartTooLarge(WorkspaceSourceFailed):
    """The cloned repository passed the task's limits (``WorkspaceQuota``)."""

    code = "workspace_git_too_large"


class WorkspaceTooLarge(WorkspaceRefused):
    """The workspace passed the task's entry-count, byte or manifest-size limit."""

    code = "workspace_limit"


class WorkspaceUnscannable(WorkspaceRefused):
    """The workspace could not be read back (a tree deeper than ``MAX_DEPTH``, a file that
    changed while it was read, an error of the disk)."""

    code = "workspace_unscannable"


class WorkspaceHoldsCredential(WorkspaceRefused):
    """A run that opened a credential left its value where a checkpoint would store it and cannot
    rewrite it (a path, a link's target, a file too large to rewrite: ``core.workspace_scrub``)."""

    code = "workspace_holds_credential"


@dataclass(frozen=True)
class WorkspaceQuota:
    """Per-task totals. The deployment's (``EngineConfig.workspace_quota``, from
    ``AGENTQ_WORKSPACE_MAX_BYTES`` and ``AGENTQ_WORKSPACE_MAX_FILES``: ``workspace`` in cdk.json,
    these defaults on the local stack) bound every task; a task's ``WorkspaceSpec`` may ask for
    less, never more (``for_task``). ``max_files`` counts every entry: files, directories,
    links, FIFOs."""

    max_bytes: int = 1024 * 1024 * 1024
    max_files: int = 100_000
    max_manifest_bytes: int = 32 * 1024 * 1024

    def for_task(self, spec: WorkspaceSpec | None) -> WorkspaceQuota:
        """This quota, lowered where the task asks for less (a request for more is refused at
        submission, ``control.defaults``; here it is ignored, never granted)."""
        if spec is None:
            return self
        return WorkspaceQuota(
            max_bytes=min(self.max_bytes, spec.max_bytes or self.max_bytes),
            max_files=min(self.max_files, spec.max_files or self.max_files),
            max_manifest_bytes=self.max_manifest_bytes,
        )


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
        paths: set[str] = set()
        for path, kind, mode, size, digest in doc["entries"]:
            check_path(str(path))
            if path in paths:
                raise ValueError(f"{path!r} appears twice in the manifest")
            paths.add(path)
            if kind not in ("d", "f", "l"):
                raise ValueError(f"unknown entry kind {kind!r} for {path!r}")
            entries.append(Entry(str(path), kind, int(mode) & 0o777, int(size), str(digest)))
        return cls(tuple(sorted(entries)))


def check_path(path: str) -> None:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
        raise ValueError(f"not a relative workspace path: {path!r}")
    if len(parts) > MAX_DEPTH:
        raise ValueError(f"{path!r} is more than {MAX_DEPTH} directories deep")


EMPTY = Manifest()


def diff(old: Manifest, new: Manifest) -> dict[str, list[str]]:
    """Paths added, removed and changed (content, mode or link target) from ``old`` to ``new``."""
    before, after = old.by_path(), new.by_path()
    return {
        "added": sorted(p for p in after if p not in before),
        "removed": sorted(p for p in before if p not in after),
        "changed": sorted(p for p in after if p in before and after[p] != before[p]),
    }
