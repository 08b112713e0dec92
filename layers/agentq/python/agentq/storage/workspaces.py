"""A task's workspace content in the bucket (``core.workspace``): content-addressed objects under
the task's own payload prefix, so the retention that purges the task purges them too
(``control.retention`` deletes the prefix) and a role limited to the prefix reaches nothing else.

``<prefix>workspace/blobs/<sha256>``: a file's content, stored once per task however many steps
and files share it; ``<prefix>workspace/manifests/<sha256>``: a manifest, under its own hash.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from agentq.storage import keys
from agentq.storage.serdes import Payloads

PARALLEL = 16  # objects in flight per restore or upload


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

    def put_blobs(self, task_id: str, blobs: dict[str, bytes]) -> None:
        items = list(blobs.items())
        if len(items) <= 1:
            for digest, data in items:
                self.payloads.put_bytes(blob_key(task_id, digest), data)
            return
        with ThreadPoolExecutor(min(PARALLEL, len(items))) as pool:
            list(pool.map(lambda kv: self.payloads.put_bytes(blob_key(task_id, kv[0]), kv[1]), items))

    def get_blobs(self, task_id: str, digests: list[str]) -> dict[str, bytes]:
        if len(digests) <= 1:
            return {d: self.payloads.get_bytes(blob_key(task_id, d)) for d in digests}
        with ThreadPoolExecutor(min(PARALLEL, len(digests))) as pool:
            datas = list(pool.map(lambda d: self.payloads.get_bytes(blob_key(task_id, d)), digests))
        return dict(zip(digests, datas, strict=True))

    def put_manifest(self, task_id: str, digest: str, data: bytes) -> None:
        self.payloads.put_bytes(manifest_key(task_id, digest), data)

    def get_manifest(self, task_id: str, digest: str) -> bytes:
        return self.payloads.get_bytes(manifest_key(task_id, digest))

    def copy_state(self, source_id: str, target_id: str, digest: str, blobs: set[str]) -> None:
        """Give ``target_id`` (a fork) its own copy of one manifest and the content it names:
        server-side copies, so the fork outlives its source's retention."""
        keys_ = [(manifest_key(source_id, digest), manifest_key(target_id, digest))]
        keys_ += [(blob_key(source_id, b), blob_key(target_id, b)) for b in sorted(blobs)]
        with ThreadPoolExecutor(min(PARALLEL, len(keys_))) as pool:
            list(pool.map(lambda pair: self.payloads.copy(*pair), keys_))
