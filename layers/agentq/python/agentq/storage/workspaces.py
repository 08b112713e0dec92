"""A task's workspace content in the bucket (``core.workspace``): content-addressed objects under
the task's own payload prefix, so the retention that purges the task purges them too
(``control.retention`` deletes the prefix) and a role limited to the prefix reaches nothing else.

``<prefix>workspace/blobs/<sha256>``: a file's content, stored once per task however many steps
and files share it; ``<prefix>workspace/manifests/<sha256>``: a manifest, under its own hash.
Both are written create-only (``If-None-Match: *``): an object under a hash is never replaced,
so whatever a later writer holds, the bytes a committed step names stay the ones it named.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from agentq.storage import keys
from agentq.storage.serdes import Payloads

PARALLEL = 16  # objects in flight per fork copy


def workspace_prefix(task_id: str) -> str:
    return f"{keys.payload_prefix(task_id)}workspace/"


def blob_key(task_id: str, digest: str) -> str:
    return f"{workspace_prefix(task_id)}blobs/{digest}"


def manifest_key(task_id: str, digest: str) -> str:
    return f"{workspace_prefix(task_id)}manifests/{digest}"


class WorkspaceObjects:
    """What the engine stores of workspaces (``core.ports.WorkspaceStore``). A missing object
    raises ``serdes.MissingObject`` (a ``LookupError``)."""

    def __init__(self, payloads: Payloads) -> None:
        self.payloads = payloads

    def put_blob(self, task_id: str, digest: str, data: bytes) -> bool:
        return self.payloads.put_bytes(blob_key(task_id, digest), data, create_only=True)

    def get_blob(self, task_id: str, digest: str) -> bytes:
        return self.payloads.get_bytes(blob_key(task_id, digest))

    def put_manifest(self, task_id: str, digest: str, data: bytes) -> None:
        self.payloads.put_bytes(manifest_key(task_id, digest), data, create_only=True)

    def get_manifest(self, task_id: str, digest: str) -> bytes:
        return self.payloads.get_bytes(manifest_key(task_id, digest))

    def copy_states(self, source_id: str, target_id: str, manifests: set[str], blobs: set[str]) -> None:
        """Give ``target_id`` (a fork) its own copy of the manifests its steps name and of the
        content they name: server-side copies, so the fork outlives its source's retention."""
        keys_ = [(manifest_key(source_id, m), manifest_key(target_id, m)) for m in sorted(manifests)]
        keys_ += [(blob_key(source_id, b), blob_key(target_id, b)) for b in sorted(blobs)]
        if keys_:
            with ThreadPoolExecutor(min(PARALLEL, len(keys_))) as pool:
                list(pool.map(lambda pair: self.payloads.copy(*pair), keys_))
