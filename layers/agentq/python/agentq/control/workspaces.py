"""A workspace's starting state as a request names it, checked before anything is written: a git
repository on a host the task allows, an uploaded archive that is there (and the tenant's), no
``base`` (only a spawn sets it); and ``POST /workspace-uploads``, an archive turned into stored
starting files (``core.workspace_archive`` refuses what would unpack outside its root).

Why an upload and not a bigger submission: the submission is one DynamoDB item read at every
claim, so inline files stop at ``MAX_SEED_ENCODED_BYTES``. An upload's content is stored
content-addressed under the tenant's own prefix (``storage.workspaces.upload_prefix``), the
submission names its manifest, and every task of the tenant that names it shares that content:
the worker restores it from there, and its checkpoints store only what the agent changes. So an
upload is kept (``storage.workspaces.upload_prefix``): the tasks naming it read it for their life.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentq.control.defaults import ENVIRONMENT
from agentq.core.errors import ValidationError
from agentq.core.tools.egress import allows
from agentq.core.tools.fetch import HostRule
from agentq.core.workspace import Manifest, WorkspaceQuota, WorkspaceSpec
from agentq.core.workspace_archive import ArchiveLimits, ArchiveRefused, unpack
from agentq.core.workspace_disk import row_bytes
from agentq.storage.container import Storage


def check_workspace(
    store: Storage,
    spec: WorkspaceSpec | None,
    *,
    tenant: str,
    field: str = "workspace",
    quota: WorkspaceQuota | None = None,
) -> None:
    """What the model cannot check alone: the git host is allowed, the upload is there, and the
    starting files (an upload's, the inline ones) fit the limits the task runs under (``quota``,
    the deployment's, lowered by the task's own ``max_bytes``/``max_files``)."""
    if spec is None:
        return
    if spec.base is not None:
        raise ValidationError(
            f"{field}.base: set by a spawn (a sub-agent's parent's workspace); a request may not name one",
            field=f"{field}.base",
        )
    if spec.git is not None:
        host, port = spec.git.host()
        rules = [HostRule.parse(h) for h in spec.allow_hosts]
        if not any(allows(rule, host, port) for rule in rules):
            raise ValidationError(
                f"{field}.git.url: {host}:{port} is not a host the workspace allows; add it to "
                f"{field}.allow_hosts (allowed: {', '.join(spec.allow_hosts) or 'none'})",
                field=f"{field}.git.url",
            )
    start = None
    if spec.upload is not None:
        manifest = store.workspaces.upload_manifest(tenant, spec.upload)
        if manifest is None:
            raise ValidationError(
                f"{field}.upload: no uploaded archive {spec.upload} for this tenant; upload it with "
                "POST /workspace-uploads",
                field=f"{field}.upload",
            )
        start = ("upload", Manifest.from_bytes(manifest))
    elif spec.files:
        start = ("files", spec.seed()[0])
    if start is not None:
        check_start(spec, start[1], quota or WorkspaceQuota(), source=f"{field}.{start[0]}", field=field)


def check_start(spec: WorkspaceSpec, start: Manifest, deployment: WorkspaceQuota, *, source: str, field: str) -> None:
    """Refuse starting files past the task's limits, counted as a checkpoint's scan counts them:
    accepted, every turn of the task would be refused (its workspace over the quota before the
    model changed a thing), with nothing to say why. Names the task's own limit when it is the
    one passed, else the starting files and the deployment's variable."""
    quota = deployment.for_task(spec)
    size = sum(row_bytes(e) for e in start.entries)
    for name, held, most, what in (
        ("max_bytes", start.total_bytes, quota.max_bytes, "bytes of files"),
        ("max_files", len(start.entries), quota.max_files, "entries (files, directories and links)"),
    ):
        if held <= most:
            continue
        if getattr(spec, name) is not None and getattr(spec, name) == most:
            raise ValidationError(
                f"{field}.{name}: {most} is less than the {held} {what} {source} starts with; ask for at least "
                "that, or leave it out",
                field=f"{field}.{name}",
            )
        raise ValidationError(
            f"{source}: {held} {what}, more than this deployment allows a task ({most}, "
            f"{ENVIRONMENT['workspace_' + name]})",
            field=source,
        )
    if size > quota.max_manifest_bytes:
        raise ValidationError(
            f"{source}: its paths and link targets make a manifest of {size} bytes, more than the "
            f"{quota.max_manifest_bytes} a task's workspace may have",
            field=source,
        )


@dataclass(frozen=True)
class Upload:
    upload: str  # the manifest's SHA-256: what a submission's workspace.upload names
    files: int
    bytes: int
    stored_bytes: int  # content not stored before (an upload shares content with earlier ones)


def upload_archive(store: Storage, data: bytes, *, tenant: str, limits: ArchiveLimits | None = None) -> Upload:
    """Store a tar or zip archive's files as starting files; a 422 naming ``archive`` (the member
    and the reason) for one that would unpack outside its root or past the limits, nothing written."""
    if not data:
        raise ValidationError("archive: empty; send a tar (optionally compressed) or zip archive", field="archive")
    try:
        manifest, blobs = unpack(data, limits)
    except ArchiveRefused as exc:
        raise ValidationError(f"archive: {exc}", field="archive") from None
    stored = store.workspaces.put_upload(tenant, manifest.to_bytes(), manifest.digest, blobs)
    return Upload(manifest.digest, manifest.files, manifest.total_bytes, stored)
