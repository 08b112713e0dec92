"""A task's workspace content in the bucket (``core.workspace``): content-addressed objects under
the task's own payload prefix, so the retention that purges the task purges them too
(``control.retention`` deletes the prefix) and a role limited to the prefix reaches nothing else.

``<prefix>workspace/blobs/<sha256>``: a file's content, stored once per task however many steps
and files share it; ``<prefix>workspace/manifests/<sha256>``: a manifest, under its own hash.
Both are written create-only (``If-None-Match: *``): an object under a hash is never replaced,
so whatever a later writer holds, the bytes a committed step names stay the ones it named.

Content a task did not write itself is looked up where it is, never copied (``lookup``: the
owners ``core.workspace.lookup_of`` names, after the task's own prefix): a tenant's uploaded
archives (``tasks/.uploads/<tenant>/workspace/...``, ``POST /workspace-uploads``) and, for a sub-agent
that started from its parent's workspace, the parent's prefix (and the parent's own lookup).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from agentq.core.ports import Readable
from agentq.storage import keys
from agentq.storage.serdes import MissingObject, Payloads

PARALLEL = 16  # objects in flight per fork copy
T = TypeVar("T")


def workspace_prefix(task_id: str) -> str:
    return f"{keys.payload_prefix(task_id)}workspace/"


def blob_key(task_id: str, digest: str) -> str:
    return f"{workspace_prefix(task_id)}blobs/{digest}"


def manifest_key(task_id: str, digest: str) -> str:
    return f"{workspace_prefix(task_id)}manifests/{digest}"


def upload_prefix(tenant: str) -> str:
    """A tenant's uploaded starting files: content-addressed like a task's, shared by every task
    that names the upload. Under the payload prefix, so the grants of the roles that read and
    write workspace content (``tasks/*/workspace/*``) cover them, but in ``.uploads``, which no
    task id can be (``.`` is not in one), so no task's purge of ``tasks/<id>/`` reaches them.

    Nothing deletes them, on purpose: a task looks its upload's content up for its whole life
    (every restore, the files API, its sub-agents' lookups; never copied), and an agent's
    definition names one for every task it will start, so no task's end and no age counted from
    the upload is a time when none needs it (the bucket expires nothing by age: infra/data.py)."""
    return f"{keys.PAYLOAD_PREFIX}.uploads/{tenant}/workspace/"


def owner_prefix(owner: str) -> str:
    """The workspace prefix of a lookup owner (``task:<id>``, ``upload:<tenant>``)."""
    kind, _, name = owner.partition(":")
    if kind == "task" and name:
        return workspace_prefix(name)
    if kind == "upload" and name:
        return upload_prefix(name)
    raise ValueError(f"unknown workspace content owner {owner!r}")


class WorkspaceObjects:
    """What the engine stores of workspaces (``core.ports.WorkspaceStore``). A missing object
    raises ``serdes.MissingObject`` (a ``LookupError``)."""

    def __init__(self, payloads: Payloads) -> None:
        self.payloads = payloads

    def put_blob(self, task_id: str, digest: str, data: bytes | Readable) -> bool:
        """Store content under its hash, create-only; a stream is sent as it is read, and the
        bucket refuses a body that does not hash to ``digest``."""
        return self.payloads.put_bytes(blob_key(task_id, digest), data, create_only=True, sha256=digest)

    def get_blob(self, task_id: str, digest: str, lookup: Sequence[str] = ()) -> bytes:
        """The content under ``digest``: the task's own, else the first owner of ``lookup`` that has it."""
        return self._first(self._blob_keys(task_id, digest, lookup), self.payloads.get_bytes)

    def open_blob(self, task_id: str, digest: str, lookup: Sequence[str] = ()) -> Readable:
        """``get_blob``'s content as a stream, to read a piece at a time (a restore)."""
        return self._first(self._blob_keys(task_id, digest, lookup), self.payloads.open_bytes)

    @staticmethod
    def _blob_keys(task_id: str, digest: str, lookup: Sequence[str]) -> list[str]:
        return [f"{workspace_prefix(task_id)}blobs/{digest}"] + [f"{owner_prefix(o)}blobs/{digest}" for o in lookup]

    @staticmethod
    def _first(keys_: list[str], read: Callable[[str], T]) -> T:
        for key in keys_[:-1]:
            try:
                return read(key)
            except MissingObject:
                continue
        return read(keys_[-1])

    def put_manifest(self, task_id: str, digest: str, data: bytes) -> None:
        self.payloads.put_bytes(manifest_key(task_id, digest), data, create_only=True)

    def get_manifest(self, task_id: str, digest: str, lookup: Sequence[str] = ()) -> bytes:
        keys_ = [manifest_key(task_id, digest)] + [f"{owner_prefix(o)}manifests/{digest}" for o in lookup]
        return self._first(keys_, self.payloads.get_bytes)

    def put_upload(self, tenant: str, manifest: bytes, digest: str, blobs: dict[str, bytes]) -> int:
        """Store an uploaded archive's content, then its manifest (so a manifest that is there
        names only content that is there); the bytes of content that was not stored yet."""
        prefix = upload_prefix(tenant)
        items = sorted(blobs.items())
        with ThreadPoolExecutor(max(1, min(PARALLEL, len(items)))) as pool:
            written = list(
                pool.map(lambda b: self.payloads.put_bytes(f"{prefix}blobs/{b[0]}", b[1], create_only=True), items)
            )
        self.payloads.put_bytes(f"{prefix}manifests/{digest}", manifest, create_only=True)
        return sum(len(data) for (_, data), new in zip(items, written, strict=True) if new)

    def upload_manifest(self, tenant: str, digest: str) -> bytes | None:
        """The manifest of the tenant's upload ``digest``; None when it has no such upload."""
        try:
            return self.payloads.get_bytes(f"{upload_prefix(tenant)}manifests/{digest}")
        except MissingObject:
            return None

    def copy_states(
        self, source_id: str, target_id: str, manifests: set[str], blobs: set[str], lookup: Sequence[str] = ()
    ) -> None:
        """Give ``target_id`` (a fork) its own copy of the manifests its steps name and of the
        content they name: server-side copies, so the fork outlives its source's retention.
        Content the source looked up elsewhere (``lookup``: its parent's, an upload's) is copied
        from where it is."""
        keys_ = [(manifest_key(source_id, m), manifest_key(target_id, m)) for m in sorted(manifests)]
        keys_ += [(blob_key(source_id, b), blob_key(target_id, b)) for b in sorted(blobs)]
        if keys_:
            with ThreadPoolExecutor(min(PARALLEL, len(keys_))) as pool:
                list(pool.map(lambda pair: self._copy(pair, lookup), keys_))

    def _copy(self, pair: tuple[str, str], lookup: Sequence[str]) -> None:
        source, target = pair
        try:
            self.payloads.copy(source, target)
        except Exception:
            if not lookup:
                raise
            rest = source.split("/workspace/", 1)[1]  # blobs/<sha> or manifests/<sha>
            for owner in lookup:
                try:
                    self.payloads.copy(f"{owner_prefix(owner)}{rest}", target)
                    return
                except Exception:
                    continue
            raise
